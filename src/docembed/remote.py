"""A running `docembed serve` as the model of a command (`--server URL`, or DOCEMBED_SERVER): the command
sends its texts to POST /encode and does everything else itself, so its output is the one it writes with
the model loaded in-process (the server returns float32 values exactly, and the metadata and identity that
`encode` records), without paying the model's load on every call of a pipeline.

Only the standard library is used here: a command that talks to a server never imports torch.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from docembed.errors import DocembedError, UsageError
from docembed.models.base import Encoder, EncoderConfig
from docembed.types import MultiVectors, Vectors

# The server's cap on texts per request (server.MAX_TEXTS); requests stay well under it.
TEXTS_PER_REQUEST = 512
TIMEOUT_S = 600.0


class RemoteEncoder(Encoder):
    """The Encoder interface over a server's /encode: the served model's name, family, dimension, kind and
    metadata, read from GET /health."""

    def __init__(self, url: str, health: dict[str, Any]):
        super().__init__(EncoderConfig(), name=str(health["model"]))
        self.url = url.rstrip("/")
        self.family = str(health["family"])  # the served model's, for messages and outputs
        self.health = health
        self._dim = int(health["dim"])

    @classmethod
    def connect(cls, url: str, expected: str | None = None) -> RemoteEncoder:
        """The encoder of the server at `url`, refused in one line when the server is not there, is not a
        docembed server, serves another model than `expected` (a -m the user gave), or serves a model that
        scores text itself (a fusion or a lexical scorer: its scores are not vectors)."""
        health = _request(url, "/health")
        missing = [k for k in ("model", "family", "dim", "multi_vector", "metadata") if k not in health]
        if missing:
            raise DocembedError(
                f"{url} answers /health without {', '.join(missing)}: is it a docembed serve?"
            )
        if health.get("scorer"):
            raise UsageError(
                f"the server at {url} serves {health['model']!r}, which scores text itself "
                f"({health['family']}), not through vectors: run this command without --server"
            )
        encoder = cls(url, health)
        if expected is not None and not encoder.serves(expected):
            raise UsageError(
                f"the server at {url} serves {encoder.name!r}, not {expected!r}: pass -m {encoder.name}, "
                "or start a server with that model (or leave out --server / DOCEMBED_SERVER)"
            )
        return encoder

    def serves(self, spec: str) -> bool:
        """Whether the model spec `spec` names the served model: its name, the name of the folder it was
        loaded from, or that folder."""
        from docembed.models.registry import ALIASES

        source = self.health["metadata"].get("model_source")
        names = {self.name, ALIASES.get(self.name.lower(), self.name)}
        if spec in names or ALIASES.get(spec.lower()) in names:
            return True
        path = Path(spec).expanduser()
        return source is not None and path.exists() and str(path.resolve()) == source

    # --- the Encoder interface -----------------------------------------------------------------------------
    def encode(self, texts: Sequence[str], batch_size: int = 32) -> Vectors:
        parts = []
        for start in range(0, max(len(texts), 1), TEXTS_PER_REQUEST):
            chunk = list(texts[start : start + TEXTS_PER_REQUEST])
            answer = _request(self.url, "/encode", {"texts": chunk, "batch_size": batch_size})
            parts.append(self._vectors(answer, len(chunk)))
        if self.multi_vector:
            return MultiVectors.concat(parts)
        return np.concatenate(parts, axis=0) if len(parts) > 1 else parts[0]

    def _vectors(self, answer: dict, expected: int) -> Vectors:
        rows = answer.get("embeddings")
        if not isinstance(rows, list) or len(rows) != expected:
            got = len(rows) if isinstance(rows, list) else "no"
            raise DocembedError(f"{self.url}/encode answered {got} embeddings for {expected} texts")
        if not self.multi_vector:
            return np.asarray(rows, dtype=np.float32).reshape(expected, self._dim)
        sets = [np.asarray(r, dtype=np.float32).reshape(-1, self._dim) for r in rows]
        positions = answer.get("positions")  # NUGGET's token positions, which outputs keep
        positions = [np.asarray(p, dtype=np.int64) for p in positions] if positions is not None else None
        vectors = MultiVectors.from_list(sets, positions)
        if not sets:  # from_list cannot know the width of nothing
            vectors = MultiVectors(np.zeros((0, self._dim), np.float32), vectors.offsets, vectors.positions)
        return vectors

    def supports(self, capability: str) -> bool:
        """Passages when the server says its model cuts them and answers /spans (an older server: not)."""
        return capability == "passages" and bool(self.health.get("passages"))

    def passage_spans(self, texts: Sequence[str]) -> list:
        """Per text, its passages' (start, end) character offsets, from the server (its model's tokenizer)."""
        self.require("passages")
        spans = []
        for start in range(0, len(texts), TEXTS_PER_REQUEST):
            chunk = list(texts[start : start + TEXTS_PER_REQUEST])
            answer = _request(self.url, "/spans", {"texts": chunk}).get("spans")
            if not isinstance(answer, list) or len(answer) != len(chunk):
                raise DocembedError(f"{self.url}/spans answered no spans for each of {len(chunk)} texts")
            spans += [np.asarray(rows, dtype=np.int64).reshape(-1, 2) for rows in answer]
        return spans

    def save(self, directory) -> None:
        raise UsageError("a model served over HTTP is not saved by the client")

    @classmethod
    def load(cls, directory, device: str = "cpu") -> RemoteEncoder:
        raise UsageError("connect to a server with RemoteEncoder.connect(url)")

    @property
    def multi_vector(self) -> bool:
        return bool(self.health["multi_vector"])

    @property
    def normalized(self) -> bool:
        return bool(self.health.get("normalized", False))

    @property
    def max_tokens(self) -> int | None:
        return None  # the server reads (and caps) each text as its model does

    @property
    def dim(self) -> int:
        return self._dim

    @property
    def passage_temperature(self) -> float:
        return float(self.health.get("passage_temperature") or 0.0)

    @property
    def long_queries(self) -> str:
        return str(self.health.get("long_queries") or "passages")

    @property
    def passage_group_tokens(self) -> int:
        return int(self.health.get("passage_group_tokens") or 0)

    def metadata(self) -> dict[str, Any]:
        return dict(self.health["metadata"])

    @property
    def identity(self) -> str | None:
        """The served model's identity key (encoding.model_identity), for `encode --reuse`."""
        return self.health.get("identity")


def _request(url: str, route: str, body: dict | None = None) -> dict:
    """One JSON request to the server; every failure is one line naming the server."""
    data = None if body is None else json.dumps(body, ensure_ascii=False).encode("utf-8")
    request = urllib.request.Request(
        url.rstrip("/") + route, data=data, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
            answer = json.loads(response.read())
    except urllib.error.HTTPError as error:
        try:
            reason = json.loads(error.read()).get("error", error.reason)
        except (ValueError, AttributeError, OSError):
            reason = error.reason
        raise DocembedError(f"the server at {url} answered {route} with {error.code}: {reason}") from None
    except (urllib.error.URLError, OSError) as error:
        reason = getattr(error, "reason", error)
        raise DocembedError(
            f"cannot reach a docembed server at {url} ({reason}): start one with `docembed serve -m MODEL`, "
            "or leave out --server / DOCEMBED_SERVER"
        ) from None
    except ValueError:
        raise DocembedError(f"the server at {url} answered {route} with something that is not JSON") from None
    if not isinstance(answer, dict):
        raise DocembedError(f"the server at {url} answered {route} with something that is not a JSON object")
    return answer
