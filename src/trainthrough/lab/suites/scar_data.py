"""Real data sets for the SCAR suite, named by environment variables.

The suite runs offline on generated data by default. Each variable below points one
workload at a real data set in its distribution format instead (the loaders are in
workloads/loaders.py and workloads/idx.py); the suite's failure point and interval stay
those of :data:`~trainthrough.lab.suites.scar.SETTINGS`, and the target becomes the
workload's default for real data, which is not calibrated on those data sets: check
in the report that the failure-free runs reach the target well after the failure.

=================  ======  ==========================================================
variable           runs    what it points at
=================  ======  ==========================================================
``TT_MOVIELENS``   mf      a MovieLens ratings file: ``ml-100k/u.data``,
                           ``ml-1m/ratings.dat``, ``ml-latest*/ratings.csv`` (or .gz)
``TT_UCI_BOW``     lda     a UCI bag-of-words ``docword.<name>.txt`` (or .gz): KOS,
                           NIPS, Enron (NYTimes and PubMed pass the 50 M-value size
                           limit and are refused); ``TT_UCI_VOCAB`` optionally names
                           its ``vocab.<name>.txt``
``TT_MNIST``       mlr,    a folder with MNIST's (or Fashion-MNIST's) four IDX files
                   cnn     ``{train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz]``
=================  ======  ==========================================================
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from trainthrough.errors import UserError

_IDX = {"train_images": "train-images-idx3-ubyte", "train_labels": "train-labels-idx1-ubyte",
        "test_images": "t10k-images-idx3-ubyte", "test_labels": "t10k-labels-idx1-ubyte"}


def _file(var: str, value: str) -> str:
    p = Path(value)
    if not p.is_file():
        raise UserError(f"{var}={value}: no such file; point it at the data file itself")
    return str(p)


def _idx_folder(var: str, value: str) -> dict[str, str]:
    d = Path(value)
    out = {}
    for key, stem in _IDX.items():
        hits = [p for p in (d / stem, d / f"{stem}.gz") if p.is_file()]
        if not hits:
            raise UserError(f"{var}={value}: no {stem} (or {stem}.gz) in that folder; "
                            "point it at the folder holding the four IDX files")
        out[key] = str(hits[0])
    return out


def real_data_options(env: dict[str, str] | None = None) -> dict[str, dict[str, Any]]:
    """Workload options (per workload) for the data sets the environment names.

    Raises:
        UserError: a variable names a file or folder that is not there.
    """
    env = dict(os.environ) if env is None else env
    out: dict[str, dict[str, Any]] = {}
    if env.get("TT_MOVIELENS"):
        out["mf"] = {"ratings_file": _file("TT_MOVIELENS", env["TT_MOVIELENS"])}
    if env.get("TT_UCI_BOW"):
        lda: dict[str, Any] = {"docword_file": _file("TT_UCI_BOW", env["TT_UCI_BOW"]),
                               "n_topics": 30, "blocks": 4}
        if env.get("TT_UCI_VOCAB"):
            lda["vocab_file"] = _file("TT_UCI_VOCAB", env["TT_UCI_VOCAB"])
        out["lda"] = lda
    if env.get("TT_MNIST"):
        files = _idx_folder("TT_MNIST", env["TT_MNIST"])
        out["mlr"] = dict(files)
        out["cnn"] = {**files, "metric": "loss"}
    return out
