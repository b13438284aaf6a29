r"""Greedy BLEU of the demo models: Multi30k validation sentences, paragraphs.

  python benchmarks/demo_bleu.py [--models=demo:target,demo:draft_large,...]
      [--task=multi30k_ende_paragraphs_local] [--examples=0]

Decodes the first --examples (0: all) validation examples of --task (needs
../shared/data) with each model alone, greedy, batches of 64, and prints
sacrebleu's corpus BLEU (13a) against the references, as the training runs'
final evaluation does (`steps.evaluate`). The paragraph task's validation
split is 289 paragraphs of 2-5 consecutive validation pairs
(`specdec_jax.data.paragraphs`, seed 0); `multi30k_ende_local` gives the 1,014
sentences (docs/demo_models.md).
"""

import time

from absl import app
from absl import flags

import specdec_jax as sd
from specdec_jax.data import batching
from specdec_jax.data import tasks
from specdec_jax.data import readers
from specdec_jax.training import steps
from specdec_jax.training import train

flags.DEFINE_list("models", ["demo:target", "demo:draft_large",
                             "demo:draft_base", "demo:draft_small"],
                  "Model specs (load_model).")
flags.DEFINE_string("task", tasks.MULTI30K_ENDE_PARAGRAPHS_LOCAL,
                    "Task whose validation split is decoded.")
flags.DEFINE_integer("examples", 0, "Validation examples (0: all).")
flags.DEFINE_integer("max_decode_len", 160, "Most tokens per output.")
args = flags.FLAGS


def main(argv):
  del argv
  for spec in args.models:
    model = sd.load_model(spec)
    vocab_path = model.vocab.sentencepiece_model_file
    with tasks.override_config(vocab_path=vocab_path):
      examples = readers.load_examples(args.task, "validation",
                                        max_examples=args.examples or None)
    config = train.TrainConfig(
        task=args.task, workdir="unused", num_steps=1, eval_examples=0,
        bleu_examples=len(examples), eval_batch_size=64,
        max_decode_len=args.max_decode_len)
    start = time.time()
    result = steps.evaluate(model, None, examples, config)
    print(f"{spec}: BLEU {result['bleu']:.1f} on {len(examples)} "
          f"{args.task} validation examples ({time.time() - start:.0f} s); "
          f"first: {result['sample']}", flush=True)


if __name__ == "__main__":
  app.run(main)
