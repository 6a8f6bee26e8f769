"""Registered one-shot FL methods. Importing this package registers every method."""

from oneshotfl.methods import (  # noqa: F401  (importing registers)
    centralized,
    dedes,
    dense,
    ensemble,
    fedage,
    fedavg,
    fedavg_rounds,
    fedcvae,
    feddf,
    fedeov,
    fedeov_distilled,
    fedet,
    fedfisher,
    fedhkt,
    fedkd,
    fedkt,
    fedol,
    fedov,
    fedpft,
    fedprox,
    fol,
    fol_variants,
    ghofl,
    heads,
    intactofl,
    inversion,
    local,
    ma_echo,
    mine,
    peer_ensemble,
    regmean,
)
from oneshotfl.methods.base import METHODS, MethodSpec, build_method, parse_method_spec

__all__ = ["METHODS", "MethodSpec", "build_method", "parse_method_spec"]
