r"""Which target shape suits speculative decoding on this machine?

  python benchmarks/shapes.py 384,1536,6,4,4 384,1536,6,3,8 384,1536,6,2,8

Each argument is d_model,d_ff,heads,encoder_layers,decoder_layers of a T5
v1.0-style model (head_dim 64, the demo vocabulary size 4224) with random
weights. For each it prints the parameter count, one decoder step (1 token,
`costs.time_extend`), the cost of scoring 4 and 6 tokens in one call
relative to it, the prefill (encoder + cross-attention keys/values) of a
22-token input, and a rough speedup estimate for the demo's typical
sentence: 12 output tokens in 3 iterations of gamma = 5 with a 0.07 ms draft
step and 0.4 ms of loop overhead per iteration (numbers measured on the demo
models with benchmarks/overhead.py). It is how the demo target's 3+8 layout
was chosen (docs/demo_models.md).
"""

from absl import app
from absl import flags
import jax
import numpy as np

from specdec_jax.decoding.protocol import Model
from specdec_jax.experiments import costs
from specdec_jax.experiments import timing
from specdec_jax.models.t5 import T5Config, T5Def

flags.DEFINE_integer("repeats", 7, "Timed repeats (the fastest is kept).")
args = flags.FLAGS


def main(argv):
  shapes = argv[1:]  # d_model,d_ff,heads,encoder_layers,decoder_layers each
  ids = np.array([list(range(3, 24)) + [1] + [0] * 2], np.int32)
  for shape in shapes:
    d, f, h, e, n = map(int, shape.split(","))
    config = T5Config(vocab_size=4224, emb_dim=d, mlp_dim=f, num_heads=h,
                      head_dim=64, num_encoder_layers=e, num_decoder_layers=n,
                      logits_via_embedding=True, max_input_len=128)
    definition = T5Def(config)
    params = definition.init_params(jax.random.key(0))
    model = Model(definition, params, None)
    t = {k: costs.time_extend(model, ids, num_tokens=k, cache_positions=70,
                              steps=16, repeats=args.repeats)
         for k in (1, 4, 6)}
    prefill = jax.jit(lambda p, i: definition.prefill(p, i, 70).cache)  # pylint: disable=cell-var-from-loop
    jax.block_until_ready(prefill(params, ids))  # compile
    _, seconds = timing.best_time(lambda: prefill(params, ids), args.repeats)  # pylint: disable=cell-var-from-loop
    pre = seconds * 1e3
    size = sum(x.size for x in jax.tree.leaves(params))
    base = pre + 12 * t[1] * 1e3
    spec = pre + 3 * (t[6] * 1e3 + 5 * 0.07 + 0.4)
    print(f"{shape:20s} {size / 1e6:6.2f}M step={t[1] * 1e3:.3f} ms "
          f"v(4 tokens)={t[4] / t[1]:.2f} v(6 tokens)={t[6] / t[1]:.2f} "
          f"prefill={pre:.2f} ms  estimated speedup={base / spec:.2f}x",
          flush=True)


if __name__ == "__main__":
  app.run(main)
