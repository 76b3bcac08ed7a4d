"""Workloads mf, lda, cnn and the custom-model API, run in a hand-rolled
bulk-synchronous loop (no engine), plus the dataset loaders on small files."""

from __future__ import annotations

import gzip
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from trainthrough.errors import UserError
from trainthrough.workloads import Evaluation, OptimizerSpec, Workload, make_workload, register
from trainthrough.workloads.cnn import CNN
from trainthrough.workloads.custom import TorchWorkload
from trainthrough.workloads.idx import read_idx, write_idx
from trainthrough.workloads.loaders import load_ratings, load_uci_bow


@pytest.fixture(autouse=True, scope="module")
def _one_thread() -> Iterator[None]:
    # Tiny tensors: intra-op threads only add contention and erratic timings.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def train(w: Workload, iterations: int, n: int = 4, seed: int = 0,
          optimizer: OptimizerSpec | None = None,
          perturb_at: int | None = None, perturb: dict[str, slice] | None = None,
          replace_worker_at: int | None = None, stop: bool = True) -> tuple[int | None, list[Evaluation]]:
    """Bulk-synchronous training with the ``add`` or ``sgd`` optimizer.

    Returns the first iteration the default target was met (or None) and every
    evaluation. ``perturb`` resets rows to their initial values
    at ``perturb_at``, as a shard re-initialized after a failure would.
    """
    opt = optimizer or w.default_optimizer
    assert opt.kind in ("add", "sgd")
    x0 = w.init_params(torch.Generator().manual_seed(seed))
    x = {k: v.clone() for k, v in x0.items()}
    parts = w.partition(n)

    def fresh(i: int) -> object:
        return w.init_worker_state(i, parts[i], x, torch.Generator().manual_seed(seed + i))

    states = [fresh(i) for i in range(n)]
    hit: int | None = None
    history: list[Evaluation] = []
    for k in range(iterations):
        if k == perturb_at and perturb:
            for name, rows in perturb.items():
                x[name][rows] = x0[name][rows]
        if k == replace_worker_at:
            states[0] = fresh(0)
        ups = [w.compute_update(x, parts[i], states[i], k, seed * 10_007 + k * 31 + i)
               for i in range(n)]
        for name in x:
            got = [u[name] for u in ups if name in u]
            if got:
                u = torch.stack(got).sum(0) / (len(got) if w.aggregate == "mean" else 1)
                x[name] += opt.lr * u if opt.kind == "add" else -opt.lr * u
        if (k + 1) % w.default_eval_every == 0:
            history.append(w.evaluate(x))
            if hit is None and w.reached(history[-1].metric, w.default_target):
                hit = k + 1
                if stop:
                    break
    return hit, history


# --- mf ---------------------------------------------------------------------------


def test_mf_reaches_target_and_not_trivially() -> None:
    w = make_workload("mf")
    hit, _ = train(w, w.default_max_iterations)
    assert hit is not None and 8 <= hit <= 60


def test_mf_recovers_from_reinitialized_rows() -> None:
    w = make_workload("mf")
    base, _ = train(w, 60)
    hit, _ = train(w, 60, perturb_at=10, perturb={"U": slice(0, 300), "V": slice(0, 100)})
    assert base is not None and hit is not None and hit >= base


def test_mf_update_touches_only_own_rows_and_is_deterministic() -> None:
    w = make_workload("mf", n_users=40, n_items=30, density=0.5)
    x = w.init_params(torch.Generator().manual_seed(1))
    part = w.partition(4)[1]
    u1 = w.compute_update(x, part, None, 0, 5)
    assert set(u1) == {"U"} and u1["U"][: part.users.rows.start].abs().sum() == 0
    assert torch.equal(u1["U"], w.compute_update(x, part, None, 0, 5)["U"])
    assert set(w.compute_update(x, part, None, 1, 5)) == {"V"}


def test_mf_rejects_bad_options() -> None:
    with pytest.raises(UserError):
        make_workload("mf", eta=0.0)
    with pytest.raises(UserError):
        make_workload("mf", bogus=1)
    with pytest.raises(UserError):
        make_workload("mf", n_users=3, n_items=3).partition(4)


# --- lda --------------------------------------------------------------------------


def test_lda_reaches_target_and_not_trivially() -> None:
    w = make_workload("lda")
    hit, _ = train(w, w.default_max_iterations)
    assert hit is not None and 8 <= hit <= 100


@pytest.mark.parametrize("rows", [slice(0, 125), slice(0, 500)])
def test_lda_recovers_from_perturbed_counts(rows: slice) -> None:
    w = make_workload("lda")
    hit, _ = train(w, w.default_max_iterations, perturb_at=10,
                   perturb={"word_topic": rows, "topic": slice(0, 10)})
    assert hit is not None


def test_lda_recovers_from_lost_worker_state() -> None:
    w = make_workload("lda")
    hit, _ = train(w, w.default_max_iterations, replace_worker_at=10)
    assert hit is not None


def test_lda_one_step_replaces_server_counts() -> None:
    # The self-correction property: x_{k+1} = sum_i n_i(z), whatever x_k was.
    w = make_workload("lda")
    x = w.init_params(torch.Generator().manual_seed(0))
    x["word_topic"][:50] += 1000.0  # a gross perturbation
    parts = w.partition(4)
    states = [w.init_worker_state(i, p, x, torch.Generator()) for i, p in enumerate(parts)]
    ups = [w.compute_update(x, p, s, 0, i) for i, (p, s) in enumerate(zip(parts, states))]
    new = x["word_topic"] + sum(u["word_topic"] for u in ups)
    exact = sum(w._counts(p.word, s.z) for p, s in zip(parts, states))
    assert torch.allclose(new, exact, atol=1e-2)
    assert new.sum().item() == pytest.approx(len(w.t_word), abs=1.0)


# --- cnn and custom models ----------------------------------------------------------


def test_cnn_sgd_decreases_loss_and_keeps_param_names() -> None:
    w = make_workload("cnn")
    x = w.init_params(torch.Generator().manual_seed(0))
    assert {"conv1.weight", "conv2.bias", "fc1.weight", "fc2.bias"} <= set(x)
    assert w.default_optimizer.kind == "adam" and w.aggregate == "mean"
    before = w.evaluate(x)
    # Plain SGD is slow and noisy on this net (Adam is its default): ask only for
    # a clear decrease of the test loss over 50 steps.
    _, hist = train(w, 50, optimizer=OptimizerSpec(kind="sgd", lr=0.2), stop=False)
    assert hist[-1].loss < before.loss - 0.1 and hist[-1].metric > before.metric + 0.1


def test_custom_workload_registers_and_trains() -> None:
    g = torch.Generator().manual_seed(0)
    xs = torch.randn(400, 5, generator=g)
    ys = (xs[:, 0] > 0).long()

    def make(seed: int, batch_size: int = 16) -> TorchWorkload:
        model = nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 2))
        return TorchWorkload(model, (xs[:300], ys[:300]), (xs[300:], ys[300:]),
                             loss_fn=F.cross_entropy, target=0.9, batch_size=batch_size,
                             optimizer=OptimizerSpec(kind="sgd", lr=0.5), seed=seed,
                             name="toy", eval_every=5)

    register("toy", make, "toy classifier")
    w = make_workload("toy", seed=3, batch_size=20)
    assert w.direction == "max" and w.metric_name == "accuracy"
    hit, _ = train(w, 200)
    assert hit is not None
    with pytest.raises(UserError):
        TorchWorkload(nn.Linear(5, 2), (xs, ys), (xs, ys), metric=lambda o, t: 0.0)


# --- loaders ------------------------------------------------------------------------


@pytest.mark.parametrize("name,text", [
    ("u.data", "196\t242\t3\t881250949\n186\t302\t3\t891717742\n196\t377\t1\t878887116\n"),
    ("ratings.dat", "1::1193::5::978300760\n2::661::3::978302109\n1::914::3::978301968\n"),
    ("ratings.csv", "userId,movieId,rating,timestamp\n1,1,4.0,964982703\n2,3,4.5,9\n1,6,4.0,9\n"),
])
def test_load_ratings_formats(tmp_path: Path, name: str, text: str) -> None:
    (tmp_path / name).write_text(text)
    r = load_ratings(tmp_path / name)
    assert (r.n_users, r.n_items, len(r.values)) == (2, 3, 3)
    assert r.users.tolist() == [0, 1, 0] and r.values.dtype == np.float32


@pytest.mark.parametrize("text,where", [
    ("1\t2\t3\t4\n1\t2\tfive\t4\n", ":2:"),
    ("1::2::3::4\n1::2\n", ":2:"),
    ("userId,movieId,rating,timestamp\n1,2,3,4,5,6\n", ":2:"),
])
def test_load_ratings_malformed(tmp_path: Path, text: str, where: str) -> None:
    (tmp_path / "r.txt").write_text(text)
    with pytest.raises(UserError, match=f"r.txt{where}"):
        load_ratings(tmp_path / "r.txt")
    with pytest.raises(UserError, match="no such file"):
        load_ratings(tmp_path / "missing.dat")


def test_mf_from_ratings_file(tmp_path: Path) -> None:
    rs = np.random.RandomState(0)
    u, v = rs.randn(60, 3), rs.randn(40, 3)
    lines = [f"{i + 1}\t{j + 1}\t{int(np.clip(np.rint(3 + u[i] @ v[j]), 1, 5))}\t0"
             for i in range(60) for j in range(40) if rs.rand() < 0.4]
    (tmp_path / "u.data").write_text("\n".join(lines) + "\n")
    w = make_workload("mf", ratings_file=str(tmp_path / "u.data"), rank=3)
    _, hist = train(w, 30)
    assert hist[-1].metric < 0.8 * hist[0].metric and w.describe()["ratings_file"].endswith("u.data")


DOCWORD = "3\n5\n6\n1 1 2\n1 3 1\n2 2 4\n2 5 1\n3 1 1\n3 4 3\n"


def test_load_uci_bow_and_lda(tmp_path: Path) -> None:
    (tmp_path / "docword.toy.txt").write_text(DOCWORD)
    with gzip.open(tmp_path / "docword.toy.txt.gz", "wt") as f:
        f.write(DOCWORD)
    (tmp_path / "vocab.toy.txt").write_text("a\nb\nc\nd\ne\n")
    c = load_uci_bow(tmp_path / "docword.toy.txt", tmp_path / "vocab.toy.txt")
    cz = load_uci_bow(tmp_path / "docword.toy.txt.gz")
    assert (c.n_docs, c.n_words, int(c.counts.sum())) == (3, 5, 12) and c.vocab[4] == "e"
    assert c.words.tolist() == cz.words.tolist() == [0, 2, 1, 4, 0, 3]
    lines = DOCWORD.splitlines()  # entries out of document order are allowed
    (tmp_path / "docword.toy.txt").write_text("\n".join(lines[:3] + lines[:2:-1]) + "\n")
    w = make_workload("lda", docword_file=str(tmp_path / "docword.toy.txt"), n_topics=2)
    assert torch.equal(w.t_doc, torch.sort(w.t_doc).values)
    _, hist = train(w, 5, n=3)
    assert len(hist) == 5 and all(np.isfinite(e.metric) for e in hist)


@pytest.mark.parametrize("text,match", [
    ("3\n5\n", "three header lines"),
    ("3\nfive\n6\n", r":2: expected a header"),
    ("3\n5\n1\n4 1 1\n", r":4: docID must be"),
    ("3\n5\n1\n1 1 0\n", r":4: docID must be"),
    ("3\n5\n2\n1 1 1\n", "NNZ=2 but found 1"),
    ("3\n5\n1\n1 1\n", r":4: expected 'docID"),
])
def test_load_uci_bow_malformed(tmp_path: Path, text: str, match: str) -> None:
    (tmp_path / "docword.bad.txt").write_text(text)
    with pytest.raises(UserError, match=match):
        load_uci_bow(tmp_path / "docword.bad.txt")


def test_load_uci_bow_vocab_mismatch(tmp_path: Path) -> None:
    (tmp_path / "d.txt").write_text(DOCWORD)
    (tmp_path / "v.txt").write_text("a\nb\n")
    with pytest.raises(UserError, match="expected 5 words"):
        load_uci_bow(tmp_path / "d.txt", tmp_path / "v.txt")


@pytest.mark.parametrize("suffix", ["", ".gz"])
def test_idx_roundtrip_and_cnn(tmp_path: Path, suffix: str) -> None:
    rs = np.random.RandomState(0)
    y = rs.randint(0, 10, 96).astype(np.uint8)
    x = (rs.rand(96, 28, 28) * 255).astype(np.uint8)
    files = {}
    for name, arr in [("train_images", x[:64]), ("train_labels", y[:64]),
                      ("test_images", x[64:]), ("test_labels", y[64:])]:
        files[name] = str(tmp_path / f"{name}-idx{suffix}")
        write_idx(files[name], arr)
    assert np.array_equal(read_idx(files["train_images"], ndim=3), x[:64])
    w = CNN(**files, batch_size=16)
    p = w.init_params(torch.Generator().manual_seed(0))
    assert p["fc1.weight"].shape == (64, 16 * 14 * 14)
    g = w.compute_update(p, w.partition(4)[0], None, 0, 0)
    assert set(g) == set(p) and 0.0 <= w.evaluate(p).metric <= 1.0


def test_idx_malformed(tmp_path: Path) -> None:
    good = tmp_path / "labels"
    write_idx(good, np.arange(10, dtype=np.uint8))
    with pytest.raises(UserError, match="expected 3 dimensions"):
        read_idx(good, ndim=3)
    (tmp_path / "html").write_bytes(b"<html>not found</html>")
    with pytest.raises(UserError, match="html: not an IDX file"):
        read_idx(tmp_path / "html")
    (tmp_path / "short").write_bytes(good.read_bytes()[:-3])
    with pytest.raises(UserError, match="short: header promises"):
        read_idx(tmp_path / "short")
    (tmp_path / "bad.gz").write_bytes(gzip.compress(good.read_bytes())[:-8])
    with pytest.raises(UserError, match="bad.gz: corrupt gzip"):
        read_idx(tmp_path / "bad.gz")
    with pytest.raises(UserError, match="no such file"):
        read_idx(tmp_path / "nope")


def test_cnn_idx_mismatch(tmp_path: Path) -> None:
    write_idx(tmp_path / "xi", np.zeros((8, 28, 28), np.uint8))
    write_idx(tmp_path / "yl", np.zeros(7, np.uint8))
    with pytest.raises(UserError, match="8 images but .* 7 labels"):
        CNN(train_images=str(tmp_path / "xi"), train_labels=str(tmp_path / "yl"),
            test_images=str(tmp_path / "xi"), test_labels=str(tmp_path / "yl"))
    with pytest.raises(UserError, match="all four"):
        CNN(train_images=str(tmp_path / "xi"))


def test_mlr_trains_on_idx_files_the_larger_option(tmp_path: Path) -> None:
    from trainthrough.workloads.mlr import MLR

    rs = np.random.RandomState(1)
    y = rs.randint(0, 10, 160).astype(np.uint8)
    # Separable on purpose: each class lights up its own band of pixels.
    x = np.zeros((160, 12, 12), np.uint8)
    for i, c in enumerate(y):
        x[i, c, :] = 255
    files = {}
    for name, arr in [("train_images", x[:128]), ("train_labels", y[:128]),
                      ("test_images", x[128:]), ("test_labels", y[128:])]:
        files[name] = str(tmp_path / name)
        write_idx(files[name], arr)
    w = MLR(**files, batch_size=16, target=0.5)
    p = w.init_params(torch.Generator().manual_seed(0))
    assert p["W"].shape == (144, 10) and w.default_target == 0.5
    before = w.evaluate(p).metric
    part = w.partition(2)[0]
    for step in range(40):
        g = w.compute_update(p, part, None, step, 0)
        p = {k: v - 0.5 * g[k] for k, v in p.items()}
    assert w.evaluate(p).metric < before / 2
    assert MLR(**files).default_target == 0.35 and MLR().default_target == 0.16
    assert w.describe()["train_images"] == files["train_images"]
    with pytest.raises(UserError, match="all four"):
        MLR(train_images=files["train_images"])


def test_digits_are_scikit_learns_without_importing_it() -> None:
    """The digits come from scikit-learn's own file, read as its load_digits reads it
    (bit for bit), and building mlr or cnn no longer imports sklearn (and scipy),
    which cost more than torch in every driver, actor and rank process."""
    import subprocess
    import sys

    from sklearn.datasets import load_digits

    from trainthrough.workloads._data import _digits

    x, y = _digits()
    d = load_digits()
    assert x.dtype == d.data.dtype and np.array_equal(x, d.data)
    assert y.dtype == d.target.dtype and np.array_equal(y, d.target)
    code = ("import sys; from trainthrough.workloads import make_workload; "
            "[make_workload(w, seed=0) for w in ('mlr', 'cnn')]; "
            "print(sorted(m for m in ('sklearn', 'scipy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True).stdout
    assert out.strip() == "[]"
