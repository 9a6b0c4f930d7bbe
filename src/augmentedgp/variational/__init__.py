"""Variational families for q(u), the one natural-gradient step on Gaussian sites, and
step-size schedules."""

from augmentedgp.variational import natgrad, schedules
from augmentedgp.variational.families import (
    CholeskyQ,
    LowRankQ,
    NaturalQ,
    QPosterior,
    SiteQ,
    make_q,
    map_latents,
)

__all__ = ["QPosterior", "CholeskyQ", "NaturalQ", "SiteQ", "LowRankQ", "make_q", "map_latents",
           "natgrad", "schedules"]
