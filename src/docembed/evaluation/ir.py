"""`docembed evaluate --qrels QRELS --run RUN`: IR measures of a run on one's own judgements, computed by
ir_measures (trec_eval's definitions through pytrec_eval), not by code of ours. A query judged in the qrels
but absent from the run scores 0 (ir_measures' convention); run queries without judgements are skipped."""

from __future__ import annotations

from pathlib import Path

from docembed.errors import DocembedError, UsageError
from docembed.io.runs import read_qrels, read_run

#: MAP, nDCG@10, MRR (RR), recall at 10 and 100: ir_measures names (`--measure` takes any of its names)
DEFAULT_MEASURES = ("AP", "nDCG@10", "RR", "R@10", "R@100")


def _ir_measures():
    try:
        import ir_measures
    except ImportError:
        raise DocembedError(
            "evaluate --qrels needs ir_measures: pip install 'docembed[ir]' (or ir-measures)"
        ) from None
    return ir_measures


def evaluate_run(
    qrels_path: str | Path, run_path: str | Path, measures: tuple[str, ...] | list[str] = DEFAULT_MEASURES
) -> dict:
    """{"measures": {name: mean}, "per_query": {name: {qid: value}}, "queries": n judged, ...}."""
    ir_measures = _ir_measures()
    parsed = []
    for name in measures:
        try:
            parsed.append(ir_measures.parse_measure(name))
        except (ValueError, NameError, SyntaxError, TypeError, AttributeError):
            raise UsageError(
                f"--measure: unknown measure {name!r} (ir_measures names: AP, nDCG@10, RR, R@100, P@5)"
            ) from None
    qrels = read_qrels(qrels_path)
    run = read_run(run_path)
    aggregate = ir_measures.calc_aggregate(parsed, qrels, run)
    per_query: dict[str, dict[str, float]] = {str(m): {} for m in parsed}
    for metric in ir_measures.iter_calc(parsed, qrels, run):
        per_query[str(metric.measure)][metric.query_id] = float(metric.value)
    return {
        "qrels": str(qrels_path),
        "run": str(run_path),
        "measures": {str(m): float(aggregate[m]) for m in parsed},
        "per_query": per_query,
        "queries": len(qrels),
        "queries_without_results": sorted(set(qrels) - set(run)),
        "run_queries_not_judged": len(set(run) - set(qrels)),
    }
