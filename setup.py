"""specdec_jax: speculative decoding (Leviathan, Kalman, Matias 2023) in JAX/Flax."""

import setuptools

_JAX = "0.10.2"

setuptools.setup(
    name="specdec_jax",
    version="0.1.0",
    description="Exact speculative decoding for Flax T5 and decoder-only models.",
    packages=setuptools.find_namespace_packages(include=["specdec_jax", "specdec_jax.*"]),
    package_data={"specdec_jax": ["demo_models/**/*", "demo_data/*"]},
    include_package_data=True,
    python_requires=">=3.11",
    install_requires=[
        f"jax=={_JAX}",
        f"jaxlib=={_JAX}",
        "flax==0.12.8",
        "optax==0.2.8",
        "orbax-checkpoint==0.12.8",
        "gin-config==0.5.0",
        "absl-py",
        "numpy",
        # Not 0.7.0: its import registers NumPy ufunc loops and promoters for
        # about 0.5-1 s on 2 cores, paid by every process that imports jax
        # (each script launch; 0.6.0 takes 0.01 s). jax 0.10.2 asks >= 0.5.0
        # and uses no dtype newer than 0.6.0's.
        "ml_dtypes==0.6.0",
        "msgpack",
        "safetensors",
        "sentencepiece",
        # BPE tokenizers (tokenizer.json) of Llama 3 and Qwen 3 checkpoints; the
        # version transformers 5.24 reads them with.
        "tokenizers==0.23.3",
        # A checkpoint's chat template (Jinja), rendered as transformers 5.24
        # renders it; 3.1.6, the first without the known sandbox escapes.
        "jinja2==3.1.6",
        "seqio==0.0.20",
        "tensorflow==2.21.0",
        "tensorflow-text==2.21.1",
        "tensorflow-datasets==4.9.10",
        "importlib_resources",  # needed by tensorflow-datasets, which does not declare it.
        "sacrebleu",
        "rouge-score",
        "matplotlib",
    ],
    extras_require={
        "test": ["pytest", "pytest-xdist", "scipy",
                 # A Cloud Storage emulator for the gs:// tests (tests/gcs_emulator.py).
                 "gcp-storage-emulator==2026.7.19"],
        "hf": ["torch==2.13.0", "transformers==5.24.0", "safetensors"],
        # `tensorboard --logdir <workdir>` (docs/tpu.md, docs/storage.md).
        "tensorboard": ["tensorboard==2.21.0"],
        "tpu": [f"jax[tpu]=={_JAX}"],
        "cuda": [f"jax[cuda12]=={_JAX}"],
    },
)
