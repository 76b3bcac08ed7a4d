"""A user's stateful objects (schedulers, scalers, EMA models, their own) as flat tensors + JSON.

``loop.attach(..., state={"sched": sched, "scaler": scaler, "ema": ema})`` registers
objects with ``state_dict()`` / ``load_state_dict()``. Their state travels with the
replica's (:meth:`~trainthrough.dp.module_replica.ModuleReplica.state`): into every
checkpoint, to every joining rank, back into a restarted one. Never as a pickle: each
``state_dict()`` is split into its tensors (``user/<name>/<i>``) and one JSON document
(``user/<name>/#json``, UTF-8 bytes in a uint8 tensor) that holds everything else and
names the tensors by their index.

What JSON cannot say is tagged so that it comes back as it was: a tuple
(``{"__tuple__": [...]}``), a dict whose keys are not all strings (``{"__dict__":
[[k, v], ...]}``, an optimizer's integer parameter ids), a float that is not finite
(``{"__float__": "inf"}``, ReduceLROnPlateau's initial best) and a tensor
(``{"__tensor__": i}``). Anything else (a function, a set, a numpy array, an object)
cannot be represented so, and registering it is refused in one line naming where it is.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any

import torch

from trainthrough.errors import UserError

Tensors = dict[str, torch.Tensor]
PREFIX = "user/"
_JSON = "#json"
_NAME = re.compile(r"[A-Za-z0-9_.-]+")
_TAGS = ("__tuple__", "__dict__", "__float__", "__tensor__")


class Unrepresentable(ValueError):
    """A value of a state dict that tensors and JSON cannot carry (``where`` says which)."""

    def __init__(self, where: str, what: object) -> None:
        super().__init__(f"{where} is a {type(what).__name__}")


def check(objects: Mapping[str, Any]) -> dict[str, Any]:
    """The registered objects, each checked once: a plain name, both methods, and a
    state that encodes (a refusal now beats one at the first checkpoint).

    Raises:
        UserError: one line naming the object and what is wrong with it.
    """
    if not isinstance(objects, Mapping):
        raise UserError("loop.attach(state=...) takes a dict of name -> object with "
                        f"state_dict() and load_state_dict() (got {type(objects).__name__})")
    out: dict[str, Any] = {}
    for name, obj in objects.items():
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise UserError(f"loop.attach(state=...): name {name!r} must be letters, digits, "
                            "'_', '.' or '-'")
        if not (callable(getattr(obj, "state_dict", None))
                and callable(getattr(obj, "load_state_dict", None))):
            raise UserError(f"loop.attach(state=...): {name!r} ({type(obj).__name__}) has no "
                            "state_dict() and load_state_dict(): wrap it in an object that has")
        out[name] = obj
        encode(name, obj)
    return out


def encode(name: str, obj: Any) -> Tensors:
    """``obj.state_dict()`` as flat entries under ``user/<name>/``.

    Raises:
        UserError: a value cannot be carried without pickle (one line naming it).
    """
    tensors: list[torch.Tensor] = []
    try:
        doc = _enc(obj.state_dict(), "state_dict()", tensors)
    except Unrepresentable as e:
        raise UserError(f"state {name!r} ({type(obj).__name__}) cannot be saved as tensors "
                        f"and JSON (trainthrough never pickles): its {e}") from None
    text = json.dumps(doc, allow_nan=False, separators=(",", ":")).encode()
    out = {f"{PREFIX}{name}/{i}": t for i, t in enumerate(tensors)}
    out[f"{PREFIX}{name}/{_JSON}"] = torch.frombuffer(bytearray(text), dtype=torch.uint8).clone()
    return out


def decode(name: str, flat: Mapping[str, torch.Tensor]) -> Any:
    """The state dict :func:`encode` flattened (tensors as stored: the object's
    ``load_state_dict`` moves them where it keeps them).

    Raises:
        KeyError: ``name``'s entries are not in ``flat``.
    """
    key = f"{PREFIX}{name}/{_JSON}"
    if key not in flat:
        raise KeyError(key)
    doc = json.loads(bytes(flat[key].cpu().numpy().tobytes()).decode())
    return _dec(doc, lambda i: flat[f"{PREFIX}{name}/{i}"].clone())


def load(objects: Mapping[str, Any], flat: Mapping[str, torch.Tensor]) -> None:
    """Give every registered object its state from ``flat``.

    Raises:
        UserError: a registered object has no state there (a checkpoint written by a
            loop that registered other objects).
    """
    for name, obj in objects.items():
        try:
            sd = decode(name, flat)
        except KeyError:
            saved = sorted({k[len(PREFIX):].split("/", 1)[0] for k in flat if k.startswith(PREFIX)})
            raise UserError(f"the state received holds no {name!r} (it holds "
                            f"{', '.join(saved) or 'no registered state'}): register the same "
                            "objects under the same names on every rank and run") from None
        obj.load_state_dict(sd)


def _enc(v: Any, where: str, tensors: list[torch.Tensor]) -> Any:
    if v is None or isinstance(v, (bool, str)):
        return v
    if isinstance(v, int):
        return int(v)
    if isinstance(v, float):
        return float(v) if math.isfinite(v) else {"__float__": repr(float(v))}
    if isinstance(v, torch.Tensor):
        tensors.append(v.detach().clone().contiguous())
        return {"__tensor__": len(tensors) - 1}
    if isinstance(v, tuple):
        return {"__tuple__": [_enc(x, f"{where}[{i}]", tensors) for i, x in enumerate(v)]}
    if isinstance(v, list):
        return [_enc(x, f"{where}[{i}]", tensors) for i, x in enumerate(v)]
    if isinstance(v, Mapping):
        if all(isinstance(k, str) for k in v) and not any(k in _TAGS for k in v):
            return {k: _enc(x, f"{where}[{k!r}]", tensors) for k, x in v.items()}
        return {"__dict__": [[_enc(k, f"{where} key {k!r}", tensors),
                              _enc(x, f"{where}[{k!r}]", tensors)] for k, x in v.items()]}
    raise Unrepresentable(where, v)


def _dec(v: Any, tensor: Any) -> Any:
    if isinstance(v, list):
        return [_dec(x, tensor) for x in v]
    if not isinstance(v, dict):
        return v
    if len(v) == 1:
        (tag, x), = v.items()
        if tag == "__tuple__":
            return tuple(_dec(y, tensor) for y in x)
        if tag == "__dict__":
            return {_hashable(_dec(k, tensor)): _dec(y, tensor) for k, y in x}
        if tag == "__float__":
            return float(x)
        if tag == "__tensor__":
            return tensor(int(x))
    return {k: _dec(x, tensor) for k, x in v.items()}


def _hashable(k: Any) -> Any:
    return tuple(_hashable(x) for x in k) if isinstance(k, list) else k
