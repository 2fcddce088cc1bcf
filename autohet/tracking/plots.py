"""PNG figures logged to MLflow: the work-unit timeline and the best result per strategy."""

from __future__ import annotations

from typing import Any

__all__ = ["comparison_figure", "pareto_figure", "timeline_figure"]


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def timeline_figure(timeline: list[dict[str, Any]], executors: list[str], title: str):
    """One lane per executor, one bar per work unit (failed units in red)."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(10, 0.5 + 0.45 * max(1, len(executors))))
    lanes = {name: i for i, name in enumerate(executors)}
    for unit in timeline:
        lane = lanes.get(unit["executor"], 0)
        color = "tab:blue" if unit.get("ok", True) else "tab:red"
        ax.broken_barh([(unit["start_s"], max(unit["end_s"] - unit["start_s"], 1e-6))], (lane - 0.4, 0.8),
                       facecolors=color, edgecolor="white", linewidth=0.3)
    ax.set_yticks(range(len(executors)), executors)
    ax.set_xlabel("seconds since the run started")
    ax.set_title(title)
    fig.tight_layout()
    return fig


def comparison_figure(best: dict[str, float], metric: str, title: str):
    plt = _plt()
    names = list(best)
    fig, ax = plt.subplots(figsize=(max(4, 0.9 * len(names) + 2), 3.5))
    ax.bar(names, [best[n] for n in names], color="tab:green")
    ax.set_ylabel(metric)
    ax.set_title(title)
    for i, n in enumerate(names):
        ax.text(i, best[n], f"{best[n]:.4g}", ha="center", va="bottom", fontsize=8)
    fig.tight_layout()
    return fig


def pareto_figure(runs: list[Any], front_runs: list[Any], objectives: Any, title: str):
    """Every ok trial on the two objectives' axes, the front highlighted and joined."""
    plt = _plt()
    a, b = objectives.objectives[:2]
    front_ids = {r.info.run_id for r in front_runs}
    fig, ax = plt.subplots(figsize=(6, 4.5))
    for run in runs:
        x, y = a.value(run.data.metrics), b.value(run.data.metrics)
        if x is None or y is None or run.data.tags.get("status", "ok") != "ok":
            continue
        on = run.info.run_id in front_ids
        ax.scatter([x], [y], c="tab:red" if on else "tab:gray", s=30 if on else 12, zorder=3 if on else 2)
    pts = sorted((a.value(r.data.metrics), b.value(r.data.metrics)) for r in front_runs)
    if pts:
        ax.plot([p[0] for p in pts], [p[1] for p in pts], c="tab:red", lw=1)
    ax.set_xlabel(f"{a.name} ({a.unit}, {a.direction})")
    ax.set_ylabel(f"{b.name} ({b.unit}, {b.direction})")
    ax.set_title(title)
    fig.tight_layout()
    return fig
