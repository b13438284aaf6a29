r"""Ships a trained model as demo:NAME (bfloat16 on disk, float32 on load).

  python scripts/export_demo_model.py --source=workdir/demo/target/model \
      --name=target
  python scripts/export_demo_model.py --source=... --name=draft_base \
      --out_dir=/tmp/candidates     # /tmp/candidates/draft_base, not shipped
"""

from absl import flags

from specdec_jax.launch import cli
from specdec_jax.tables import demo

_SOURCE = flags.DEFINE_string("source", None, "load_model spec of the model.",
                              required=True)
_NAME = flags.DEFINE_string("name", None, "Demo name.", required=True)
_OUT_DIR = flags.DEFINE_string(
    "out_dir", None, "Write <out_dir>/<name> instead of replacing the "
    "shipped model (None: specdec_jax/demo_models/), e.g. to measure a "
    "candidate before shipping it.")


def main(argv):
  del argv
  print(demo.export_model(_SOURCE.value, _NAME.value, out_dir=_OUT_DIR.value))


if __name__ == "__main__":
  cli.run(main)
