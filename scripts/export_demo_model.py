r"""Ships a trained model as demo:NAME (bfloat16 on disk, float32 on load).

  python scripts/export_demo_model.py --source=workdir/demo/target/model \
      --name=target
"""

from absl import app
from absl import flags

from specdec_jax.experiments import demo

_SOURCE = flags.DEFINE_string("source", None, "load_model spec of the model.",
                              required=True)
_NAME = flags.DEFINE_string("name", None, "Demo name.", required=True)


def main(argv):
  del argv
  print(demo.export_model(_SOURCE.value, _NAME.value))


if __name__ == "__main__":
  app.run(main)
