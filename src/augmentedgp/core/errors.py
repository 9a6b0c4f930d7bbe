"""Library exceptions. Bad user input raises ``ValueError``; numerical failures raise these."""


class AugmentedGPError(RuntimeError):
    """Base class of the numerical failures raised by augmentedgp."""


class NotPositiveDefiniteError(AugmentedGPError, ValueError):
    """A matrix that must be positive definite was not, even after adding jitter."""

    def __init__(self, what: str = "matrix", jitter: float | None = None):
        tried = f" (jitter escalated up to {jitter:.1e} x mean diagonal)" if jitter else ""
        super().__init__(
            f"The {what} is not positive definite{tried}. Common causes: NaN in the data, "
            "duplicated or nearly duplicated inputs with a tiny noise variance, unscaled "
            "inputs/targets, or a lengthscale far too long. Standardise X and y, raise the "
            "noise variance, or raise the jitter (augmentedgp.linalg.set_jitter_levels)."
        )


class ConvergenceError(AugmentedGPError):
    """An iterative method diverged (its objective or state became non-finite)."""


def user_stacklevel() -> int:
    """The ``stacklevel`` of a warning raised here that points at the first frame outside
    augmentedgp: the user's call, however deep the library's own calls go."""
    import inspect
    import os

    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    frame, level = inspect.currentframe().f_back, 1
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(package):
        frame, level = frame.f_back, level + 1
    return level
