"""What NUGGET keeps: how often each token type is chosen as a nugget against how often it occurs (the
paper's Figure 5), for `docembed inspect` and bench/bench_nugget.py."""

from __future__ import annotations

from collections import Counter
from typing import Any


def nugget_token_statistics(items, tokenizer) -> dict[str, Any]:
    """How often each token type is chosen as a nugget versus how often it occurs (paper Figure 5).
    `items` is what `NuggetEncoder.nuggets` returns. Rows are sorted by times chosen."""

    seen, chosen = Counter(), Counter()
    for _, positions, ids in items:
        tokens = tokenizer.convert_ids_to_tokens(ids)
        seen.update(tokens)
        chosen.update(tokens[p] for p in positions.tolist())
    total_tokens, total_nuggets = sum(seen.values()), sum(chosen.values())

    def row(token: str) -> dict[str, Any]:
        return {
            "token": token,
            "chosen": chosen[token],
            "seen": seen[token],
            "nugget_share": chosen[token] / max(total_nuggets, 1),
            "token_share": seen[token] / max(total_tokens, 1),
            "selection_rate": chosen[token] / max(seen[token], 1),
        }

    return {
        "documents": len(items),
        "tokens": total_tokens,
        "nuggets": total_nuggets,
        "rows": [row(t) for t, _ in chosen.most_common()],
        "frequent": [row(t) for t, _ in seen.most_common(20)],
    }
