"""The main job on its embedded default (not built yet: see the open issues)."""
import sys

sys.exit("make demo: the demo models and script are not built yet.")
