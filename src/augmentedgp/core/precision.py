"""float64 by default (imported first by the package root): GP linear algebra in float32
is a known source of Cholesky failures.

Importing augmentedgp enables ``jax_enable_x64`` unless the environment variable
``AUGMENTEDGP_DISABLE_X64=1`` is set (then JAX's own default, float32, is left alone).
"""

import os

import jax

if os.environ.get("AUGMENTEDGP_DISABLE_X64", "0").lower() not in ("1", "true", "yes"):
    jax.config.update("jax_enable_x64", True)
