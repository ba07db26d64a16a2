"""Table and ratios for one `bench/run.sh` results file; writes bench/RESULTS.md.

    python bench/report.py RESULTS.jsonl [--commands FILE] [--peers DIR] [--write PATH]
                           [--batches BATCHES.jsonl] [--limits LIMITS.jsonl]

The table is the shared harness's own (summarize.py); the ratios compare Conveyor
on PostgreSQL with PgQueuer at batch size 100, round by round (run.sh alternates them).
``--batches`` adds the section for bench/bench_batches.py's results, ``--limits``
the one for bench/bench_limits.py's.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import io
import json
import os
import platform
import re
import statistics
import sys
from operator import methodcaller
from pathlib import Path

GOAL_BULK = 50_000


def load(path: str) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip().startswith("{")]


def mean(rows: list[dict], get) -> float | None:
    values = [v for r in rows if (v := get(r)) is not None]
    return statistics.fmean(values) if values else None


def p50(r: dict) -> float | None:
    return (r.get("latency") or {}).get("p50_ms")


def table(path: str, peers: Path) -> str:
    sys.path.insert(0, str(peers))
    import summarize

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        summarize.main([path])
    return buf.getvalue().rstrip("\n")


def ratios(rows: list[dict]) -> list[str]:
    """Conveyor/PostgreSQL against PgQueuer batch 100. run.sh alternates their runs,
    so the k-th of each is one round: a ratio is taken per round and the median of
    those is the figure (the machine's speed drifts between rounds, as far as a
    quarter, and a ratio of runs made minutes apart would measure that drift too)."""

    def pick(library: str, key: str, value: object) -> list[dict]:
        return [r for r in rows if r["library"] == library and r["settings"].get(key) == value]

    pgq = pick("pgqueuer", "batch_size", 100)
    cpg = pick("conveyor", "backend", "postgres")
    csq = pick("conveyor", "backend", "sqlite")
    if not pgq or not cpg:
        return ["(ratios need both PgQueuer batch-100 and Conveyor/PostgreSQL rows)"]
    rounds = list(zip(cpg, pgq, strict=False))  # a failed run leaves one short

    def verdict(ok: bool) -> str:
        return "met" if ok else "MISSED"

    def per_round(get, *, inverse: bool = False) -> tuple[float, str]:
        values = [
            (p / c if inverse else c / p)
            for c, p in ((get(c), get(p)) for c, p in rounds)
            if c and p
        ]
        if not values:
            return float("nan"), "no rounds"
        listed = ", ".join(f"{v:.2f}" for v in values)
        return statistics.median(values), f"rounds {listed}"

    def both(get) -> str:
        c, p = mean(cpg, get), mean(pgq, get)
        return f"{c:,.0f} / {p:,.0f}"

    drain = methodcaller("get", "process_jobs_s")
    bulk = methodcaller("get", "enqueue_bulk_jobs_s")
    single = methodcaller("get", "enqueue_single_jobs_s")

    def p99(r: dict) -> float | None:
        return (r.get("latency") or {}).get("p99_ms")

    d, d_rounds = per_round(drain)
    b, b_rounds = per_round(bulk)
    s, s_rounds = per_round(single)
    l_c, l_p = mean(cpg, p50), mean(pgq, p50)
    q_c = mean(cpg, p99)
    lines = [
        f"Conveyor/PostgreSQL vs PgQueuer batch 100, {len(rounds)} alternating round(s); "
        "ratios are the median of the rounds' ratios, jobs/s the means (goals: issue 41):",
        f"- drain: {both(drain)} jobs/s, **{d:.2f}x** ({d_rounds}; goal >= 2.0: "
        f"{verdict(d >= 2.0)})",
        f"- bulk enqueue: {both(bulk)} jobs/s, **{b:.2f}x** ({b_rounds}; goal >= 1.5: "
        f"{verdict(b >= 1.5)}; and >= {GOAL_BULK:,} jobs/s: "
        f"{verdict((mean(cpg, bulk) or 0) >= GOAL_BULK)})",
        f"- one-by-one enqueue: {both(single)} jobs/s, **{s:.2f}x** ({s_rounds}; "
        f"goal >= 1.2: {verdict(s >= 1.2)})",
        f"- latency p50: {l_c:.2f} / {l_p:.2f} ms (goal <= 2 ms: {verdict(l_c <= 2.0)}); "
        f"p99 {q_c:.2f} ms (goal <= 5 ms: {verdict(q_c <= 5.0)})",
    ]
    call_c = mean(cpg, lambda r: (r.get("enqueue_call_ms") or {}).get("p50_ms"))
    call_p = mean(pgq, lambda r: (r.get("enqueue_call_ms") or {}).get("p50_ms"))
    if call_c is not None and call_p is not None:
        lines.append(
            f"- latency p50 split: enqueue call {call_c:.2f} / {call_p:.2f} ms, "
            f"after the call returned {l_c - call_c:.2f} / {l_p - call_p:.2f} ms"
        )
    if csq:
        lines.append(
            f"- Conveyor/SQLite (for reference): drain "
            f"{mean(csq, drain):,.0f} jobs/s, latency p50 "
            f"{mean(csq, p50):.2f} ms, bulk enqueue "
            f"{mean(csq, bulk):,.0f} jobs/s"
        )
    return lines


def _ms(d: dict | None, *keys: str) -> str:
    if not d:
        return "-"
    return " / ".join(f"{d[k]:,.1f}" for k in keys)


def batches_section(rows: list[dict], path: str) -> list[str]:
    """The Markdown section for bench/bench_batches.py's JSON lines."""
    rows = [r for r in rows if r.get("bench") == "batches"]
    if not rows:
        return ["## Batches", "", f"(no batch results in `{path}`)", ""]
    names = {"postgres": "PostgreSQL", "sqlite": "SQLite"}

    def by(measure: str, backend: str, state: str | None = None) -> dict | None:
        found = [
            r
            for r in rows
            if r["measure"] == measure
            and r["backend"] == backend
            and (state is None or r.get("state") == state)
        ]
        return found[-1] if found else None

    backends = [b for b in ("postgres", "sqlite") if any(r["backend"] == b for r in rows)]
    head = "| measurement | " + " | ".join(names[b] for b in backends) + " |"
    table = [head, "|---|" + "---|" * len(backends)]

    def line(label: str, cell) -> None:
        table.append(f"| {label} | " + " | ".join(cell(b) for b in backends) + " |")

    create = next((r for r in rows if r["measure"] == "create"), None)
    if create:

        def c_cell(b: str) -> str:
            r = by("create", b)
            if not r:
                return "-"
            return (
                f"**{r['items_s']:,.0f}** items/s ({r['n'] / r['items_s']:.2f} s); "
                f"send_many: {r['send_many_items_s']:,.0f} items/s"
            )

        line(
            f"create a {create['n']:,}-item batch, `task.batch(items)`, median of "
            f"{create['runs']} fresh databases",
            c_cell,
        )
    plans = []
    for r in rows:
        if r["measure"] != "progress":
            continue
        done = sum(r["counts"].get(s, 0) for s in ("succeeded", "failed", "cancelled"))

        def p_cell(b: str, r: dict = r) -> str:
            if b != r["backend"]:
                return "n/a"
            return (
                f"**{_ms(r['progress'], 'p50_ms', 'p95_ms')}** "
                f"(its counts alone {_ms(r['query'], 'p50_ms', 'p95_ms')})"
            )

        how = ""
        if r.get("drain"):
            d = r["drain"]
            how = f", drained by a no-op worker at {d['jobs_s']:,.0f} jobs/s"
        line(
            f"`batch.progress()` on a {r['n']:,}-job batch, {r['state']} "
            f"({done:,} finished{how}), p50 / p95 ms of {r['calls']} calls after ANALYZE",
            p_cell,
        )
        for kind, e in (r.get("explain") or {}).items():
            plans.append(f"- {r['state']}, {kind} plan: `{e['summary']}`")
    close = next((r for r in rows if r["measure"] == "close_delay"), None)
    if close:

        def d_cell(b: str) -> str:
            r = by("close_delay", b)
            if not r:
                return "-"
            verdict = "met" if r["met"] else "MISSED"
            return (
                f"**{_ms(r['delay'], 'p50_ms', 'p99_ms', 'max_ms')}** "
                f"(goal < {r['goal_ms']:,.0f} ms: {verdict})"
            )

        line(
            f"close delay, {close['batches']} batches x {close['items']} no-op jobs, "
            f"one every {close['gap_s'] * 1000:.0f} ms, flow_poll_s={close['flow_poll_s']:g}: "
            "p50 / p99 / max ms",
            d_cell,
        )

        def e_cell(b: str) -> str:
            r = by("close_delay", b)
            return _ms(r and r["created_to_closed"], "p50_ms", "p99_ms", "max_ms")

        line("same batches, created to closed: p50 / p99 / max ms", e_cell)
    out = [
        "## Batches",
        "",
        f"`bench/bench_batches.py` (raw results: `{path}`). PostgreSQL database "
        "`bench_batches` (dropped and created per measurement), SQLite "
        f"`{rows[0]['settings'].get('sqlite_file', '?')}`; workers are in-process "
        "`Worker`s on their own thread and connections. Close delay = the batch's "
        "`finished_at` (written by the aggregator when it closes the batch) minus the "
        "latest `finished_at` of its jobs. The PostgreSQL aggregator is woken by "
        'NOTIFY "@flow", the SQLite one by its `PRAGMA data_version` watcher or poll.',
        "",
        *table,
        "",
    ]
    if plans:
        out += ["EXPLAIN (ANALYZE, BUFFERS) of the backend's `batch_progress` query:", ""]
        out += [*plans, ""]
    probes = [r for r in rows if r["measure"] == "finalize_probe"]
    if probes:
        p0 = probes[0]
        out += [
            f"Outcome writes (`job_finalize_many`, {p0['chunk']} outcomes per call, "
            f"{p0['running']} jobs running, through the backend as a worker's completer "
            "calls it), p50 / max ms; calls 11+ may use the prepared statement's generic "
            "plan:",
            "",
        ]
        for r in probes:
            late = r.get("calls_11_on")
            out.append(
                f"- {r['stats']}: calls 1-10 {_ms(r['calls_1_10'], 'p50_ms', 'max_ms')}, "
                f"calls 11-{len(r['calls_ms'])} {_ms(late, 'p50_ms', 'max_ms')}"
            )
        out.append("")
    return out


def _actual(node: str) -> tuple[float, float] | None:
    """(start, end) ms of an EXPLAIN ANALYZE node's ``actual time=a..b``."""
    m = re.search(r"actual time=([0-9.]+)\.\.([0-9.]+)", node or "")
    return (float(m.group(1)), float(m.group(2))) if m else None


def limits_section(rows: list[dict], path: str) -> list[str]:
    """The Markdown section for bench/bench_limits.py's JSON lines."""
    rows = [r for r in rows if r.get("bench") == "limits"]
    drains = [r for r in rows if r.get("measure", "drain") == "drain"]
    if not drains:
        return ["## Concurrency limits", "", f"(no limit results in `{path}`)", ""]
    names = {"postgres": "PostgreSQL", "sqlite": "SQLite"}
    backends = [b for b in ("postgres", "sqlite") if any(r["backend"] == b for r in drains)]
    configs = list(dict.fromkeys(r["config"] for r in drains))

    def all_of(backend: str, config: str) -> list[dict]:
        return [r for r in drains if r["backend"] == backend and r["config"] == config]

    def by(backend: str, config: str) -> dict | None:
        """The run of the median throughput (the last, if there is one run)."""
        found = sorted(all_of(backend, config), key=lambda r: r.get("process_jobs_s") or 0)
        return found[len(found) // 2] if found else None

    def ratios(backend: str, config: str) -> list[float]:
        """Per round: this configuration's drain over the same round's unlimited one
        (rows without a round, from older runs, pair in order)."""
        base = {r.get("round", i): r for i, r in enumerate(all_of(backend, "unlimited"))}
        out = []
        for i, r in enumerate(all_of(backend, config)):
            b = base.get(r.get("round", i))
            if b and b.get("process_jobs_s") and r.get("process_jobs_s"):
                out.append(r["process_jobs_s"] / b["process_jobs_s"])
        return out

    table = [
        "| configuration | " + " | ".join(names[b] for b in backends) + " |",
        "|---|" + "---|" * len(backends),
    ]
    for config in configs:
        label = next(r["label"] for r in drains if r["config"] == config)

        def cell(b: str, config: str = config) -> str:
            runs = [r for r in all_of(b, config) if r.get("process_jobs_s")]
            if not runs:
                return "-"
            speeds = ", ".join(f"{r['process_jobs_s']:,.0f}" for r in runs)
            rs = ratios(b, config) if config != "unlimited" else []
            ratio = (
                f" (**{statistics.median(rs):.2f}x**"
                + (f"; rounds {', '.join(f'{x:.2f}' for x in rs)}" if len(rs) > 1 else "")
                + ")"
                if rs
                else ""
            )
            late = " TIMED OUT" if any(r.get("timed_out") for r in runs) else ""
            median = statistics.median(r["process_jobs_s"] for r in runs)
            return f"**{median:,.0f}** jobs/s{ratio}{late}" + (
                f" <br>({speeds})" if len(runs) > 1 else ""
            )

        table.append(f"| {label} | " + " | ".join(cell(b) for b in backends) + " |")

    where = [
        "| backend | configuration | span s | claims (empty) | jobs per claim "
        "| claim p50 / p95 ms | in claims s | idle after short claims s (p50 ms) "
        "| idle after empty claims s (p50 ms) | running in db: max (per key) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for b in backends:
        for config in configs:
            r = by(b, config)
            if not r:
                continue
            f = r.get("fetch") or {}
            gaps = f.get("gap_after") or {}

            def gap(kind: str, gaps: dict = gaps) -> str:
                g = gaps.get(kind)
                return f"{g['total_s']:.2f} ({g['p50_ms']:.0f})" if g else "-"

            db = r.get("db_running") or {}
            per_key = db.get("max_running_per_key")
            running = f"{db.get('max_running', '-')}" + (
                f" ({per_key})" if r.get("keys") and per_key is not None else ""
            )
            where.append(
                f"| {names[b]} | {config} | {r['process_span_s']:.2f} | "
                f"{f.get('calls', 0)} ({f.get('empty', 0)}) | {f.get('rows_mean', 0):.1f} | "
                f"{f.get('p50_ms', 0):.1f} / {f.get('p95_ms', 0):.1f} | "
                f"{f.get('total_s', 0):.2f} | {gap('short')} | {gap('empty')} | {running} |"
            )

    d0 = drains[0]
    out = [
        "## Concurrency limits",
        "",
        f"`bench/bench_limits.py` (raw results: `{path}`). Drain of {d0['n']:,} no-op "
        f"async jobs by one worker process (`concurrency={d0['concurrency']}, "
        f"fetch_batch={d0['fetch_batch']}`) started after the enqueue; jobs/s from the first "
        "handler start to the last handler end (the shared harness's phase b), each "
        "configuration in a fresh database (PostgreSQL `bench_limits`, SQLite "
        f"`{d0['settings'].get('sqlite_file', '?')}`); each configuration's median over "
        f"{max(len(all_of(b, c)) for b in backends for c in configs)} round(s) (each run "
        "below it), in brackets the median of the rounds' ratios to the same round's "
        "unlimited drain on the same backend (the machine's speed drifts between rounds). "
        'Per-key limits: `@app.task(concurrency_key="user", '
        "concurrency_limit=L)` with `user = i % keys`; queue limit: "
        "`app.set_queue_limit(queue, max_running=N)`. "
        + (
            "Rate limits are not implemented in Conveyor yet, so there is no rate-limit "
            "configuration or column."
            if d0["settings"].get("rate_limits", "not implemented") == "not implemented"
            else f"Rate limits: {d0['settings']['rate_limits']}, so no rate-limit column yet."
        ),
        "",
        *table,
        "",
        "Where the time goes (the worker process's `job_claim` calls, timed on the "
        "backend instance; idle = from a claim's return to the next claim's start, by what "
        "the claim returned: short = fewer jobs than asked; running in db = the largest "
        f"count of `running` jobs in {d0['db_running'].get('every_s', 0.1):g} s samples, the "
        "limits count a job as running from its claim until its outcome is written):",
        "",
        *where,
        "",
    ]
    for r in (r for r in rows if r.get("measure") == "claim_plan"):
        out += [
            "EXPLAIN (ANALYZE, BUFFERS) of the PostgreSQL limited claim "
            "(`job_claim_candidates`, then `job_claim_keyed` with their ids and keys: two "
            "of the "
            "statements its function runs in one call where keys alone limit, each "
            "explained alone) "
            f"({r['config']}, {r['finished']:,} of {r['n']:,} jobs finished, "
            f"{r['held_running']} running; rolled back):",
            "",
        ]
        for stats, pl in r["plans"].items():
            sm = pl["summary"]
            cand, join = _actual(sm.get("cand", "")), _actual(sm.get("join", ""))
            parts = [sm.get("execution", "?")]
            if cand:
                parts.append(f"candidates ({sm.get('cand_scan', '?')}, locked): {cand[1]:.1f} ms")
            if join:
                kind = sm["join"].split("  (")[0]
                removed = sm.get("join_removed", "").split(":")[-1].strip()
                parts.append(
                    f"ranked candidates x running per key ({kind}): {join[1] - join[0]:.1f} ms"
                    + (f", {int(removed):,} rows removed by the join filter" if removed else "")
                )
            out.append(f"- {stats}: " + "; ".join(parts))
        out.append("")
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("results")
    p.add_argument("--commands", help="file listing the benchmark commands that were run")
    p.add_argument(
        "--peers",
        default=os.environ.get("PEERBENCH_PEERS", ""),
        help="the shared peer folder (holds summarize.py)",
    )
    p.add_argument("--write", help="also write the report (Markdown) here")
    p.add_argument("--command", default="make bench", help="the command that produced it")
    p.add_argument("--batches", help="bench/bench_batches.py results (JSON lines) to add")
    p.add_argument("--limits", help="bench/bench_limits.py results (JSON lines) to add")
    args = p.parse_args()

    rows = load(args.results)
    tbl = table(args.results, Path(args.peers))
    rat = ratios(rows)
    print(tbl)
    print()
    print("\n".join(rat))
    if args.batches:
        print()
        print("\n".join(batches_section(load(args.batches), args.batches)))
    if args.limits:
        print()
        print("\n".join(limits_section(load(args.limits), args.limits)))

    if args.write:
        cmds = Path(args.commands).read_text().strip() if args.commands else ""
        commits = sorted({r["settings"].get("commit", "") for r in rows} - {""})
        cpuinfo = Path("/proc/cpuinfo").read_text().splitlines()
        cpu = next(
            (ln.split(":", 1)[1].strip() for ln in cpuinfo if ln.startswith("model name")),
            platform.processor() or "unknown",
        )
        nproc = len(os.sched_getaffinity(0))
        doc = [
            "# Benchmark results",
            "",
            "Generated by `bench/run.sh`; do not edit by hand (rerun `make bench`).",
            "",
            f"- date: {dt.datetime.now().astimezone().strftime('%Y-%m-%d %H:%M %Z')}",
            f"- machine: `nproc` = {nproc}, {cpu}, Python {platform.python_version()}",
            f"- Conveyor commit: {', '.join(commits) or 'unknown'}",
            f"- PostgreSQL: {os.environ.get('PEERBENCH_PG', '(PEERBENCH_PG unset)')}",
            f"- command: `{args.command}` (from the repository root), which ran:",
            "",
            "```",
            cmds,
            "```",
            "",
            f"Raw results: `{args.results}`. Phases (shared harness `_common.py`): bulk enqueue of "
            f"{rows[0]['n']:,} no-op jobs in chunks of 1,000, then 2,000 one call each; drain by "
            "one worker process (jobs/s from first start to last end; wall incl. start-up in "
            "brackets); enqueue-to-start latency of 200 jobs sent at 50/s to an idle worker.",
            "",
            tbl,
            "",
            *rat,
            "",
        ]
        if args.batches:
            doc += batches_section(load(args.batches), args.batches)
        if args.limits:
            doc += limits_section(load(args.limits), args.limits)
        Path(args.write).write_text("\n".join(doc))


if __name__ == "__main__":
    main()
