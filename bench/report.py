"""bench.bench's results: the measured dict turned into the JSON keys, the targets met, and the
side-by-side tables."""

from __future__ import annotations

import os
from typing import Any


from . import memory, processes
from .stats import pct

TARGETS = {"restore_ttfc_p50_ms": ("<=", 100.0), "ttfc_p99_ms": ("<=", 250.0),
           "warm_acquire_p50_ms": ("<=", 5.0), "restore_overhead_ratio": ("<=", 1.1),
           "exec_p50_ms": ("<=", 5.0), "exec_over_spawn_ms": ("<=", 2.0), "idle_mib": ("<=", 20.0), "net_restore_extra_ms": ("<=", 20.0),
           "fs_image_boot_p50_ms": ("<", 1000.0), "episodes_per_s": (">=", 20.0),
           "runc_episodes_per_s": (">=", 100.0), "max_idle_sandboxes": (">=", 500.0)}


# ---- report ------------------------------------------------------------------------------------

def r(x: float, nd: int = 1) -> float:
    return round(x, nd)


def _met(value: float, op: str, target: float) -> bool:
    return bool({"<=": value <= target, "<": value < target, ">=": value >= target}[op])


def build_results(m: dict[str, Any]) -> dict[str, Any]:
    res: dict[str, Any] = {
        "cold_ttfc_p50_ms": r(pct(m["cold"], .5)), "cold_ttfc_p99_ms": r(pct(m["cold"], .99)),
        "raw_runsc_cold_p50_ms": r(pct(m["raw_cold"], .5)),
        "restore_ttfc_p50_ms": r(pct(m["restore"], .5)), "restore_ttfc_p99_ms": r(pct(m["restore"], .99)),
        "raw_runsc_restore_p50_ms": r(pct(m["raw_restore"], .5)),
        "raw_runsc_restore_only_p50_ms": r(pct(m["raw_restore_only"][1:], .5)),
        "restore_overhead_ratio": r(pct(m["restore"], .5) / pct(m["raw_restore"], .5), 2),
        "warm_restore_ttfc_p50_ms": r(pct(m["warm"], .5)), "warm_restore_ttfc_p99_ms": r(pct(m["warm"], .99)),
        "exec_p50_ms": r(pct(m["exec"], .5), 2), "exec_p99_ms": r(pct(m["exec"], .99), 2),
        "raw_runsc_exec_p50_ms": r(pct(m["raw_exec"], .5), 1),
        "exec_paired_p50_ms": r(pct(m["exec_vs_spawn"]["exec"], .5), 2),
        "in_sandbox_spawn_p50_ms": r(pct(m["exec_vs_spawn"]["spawn"], .5), 2),
        "exec_over_spawn_ms": r(pct(m["exec_vs_spawn"]["exec"], .5) - pct(m["exec_vs_spawn"]["spawn"], .5), 2),
        "http_rtt_p50_ms": r(pct(m["http_rtt"], .5), 2), "agent_rtt_p50_ms": r(pct(m["agent_rtt"], .5), 2),
        "fork8_s": r(m["fork8_s"], 2), "exec_fanout": m["exec_fanout"], "processes": m.get("processes"),
        "net_restore_ttfc_p50_ms": r(pct(m["net_restore"], .5)),
        "net_cold_ttfc_p50_ms": r(pct(m["net_cold"], .5)),
        "net_restore_extra_ms": r(pct(m["net_restore"], .5) - pct(m["restore_pair"], .5)),
        "net_cold_extra_ms": r(pct(m["net_cold"], .5) - pct(m["cold_pair"], .5)),
        "net_churn": m.get("net_churn"),
        "fs_image_boot_p50_ms": r(pct(m["fs_image"], .5)),
    }
    for c, (eps, _bad) in m["pool"].items():
        res[f"episodes_per_s_c{c}"] = r(eps, 2)
    res["episodes_per_s"] = max(res[f"episodes_per_s_c{c}"] for c in m["pool"])
    res["episode_failures"] = sum(bad for _eps, bad in m["pool"].values())
    for c, eps in m["raw_eps"].items():
        res[f"raw_runsc_episodes_per_s_c{c}"] = r(eps, 2)
    res["idle_mib"] = r(m["idle"].pss_mib)
    res["idle_cgroup_mib"] = r(m["idle"].cgroup_mib)
    res["raw_runsc_idle_mib"] = r(m["raw_idle"].pss_mib)
    res["raw_runsc_idle_cgroup_mib"] = r(m["raw_idle"].cgroup_mib)
    res["idle_cpu_pct"] = r(m["idle"].cpu_pct, 2)
    res["raw_runsc_idle_cpu_pct"] = r(m["raw_idle"].cpu_pct, 2)
    if m.get("idle_ptrace"):
        res["ptrace_idle_mib"] = r(m["idle_ptrace"].pss_mib)
        res["ptrace_idle_cpu_pct"] = r(m["idle_ptrace"].cpu_pct, 2)
    tiers = m["tiers"]
    res["tiers"] = {k: t.row() for k, t in tiers.items()}
    wa = m["warm_acquire"]
    res["ttfc_p50_ms"], res["ttfc_p99_ms"] = res["restore_ttfc_p50_ms"], res["restore_ttfc_p99_ms"]
    res["warm_acquire_p50_ms"] = r(pct(wa["acquire_ms"], .5), 2)
    res["warm_acquire_daemon_p50_ms"] = r(pct(wa["daemon_ms"], .5), 2)
    res["warm_first_exec_p50_ms"] = r(pct(wa["first_exec_ms"], .5), 2)
    res["episodes_per_s"] = r(max(max(tiers["gvisor"].eps.values()), res["episodes_per_s"]), 2)
    res["runc_episodes_per_s"] = r(max(tiers["runc"].eps.values()), 2)
    sub_eps = max(tiers["subprocess"].eps.values())
    res["ratio_ttfc_vs_raw_runsc"] = res["restore_overhead_ratio"]
    res["ratio_ttfc_vs_no_isolation"] = r(pct(m["restore"], .5) / pct(tiers["subprocess"].ttfc_ms, .5), 1)
    res["ratio_eps_vs_no_isolation"] = r(res["episodes_per_s"] / sub_eps, 4)
    res["ratio_runc_eps_vs_no_isolation"] = r(res["runc_episodes_per_s"] / sub_eps, 4)
    res["ratio_runc_ttfc_vs_raw_runc"] = r(pct(tiers["runc"].ttfc_ms, .5) / pct(tiers["raw_runc"].ttfc_ms, .5), 2)
    if m.get("admission"):
        res["admission"] = m["admission"]
    if m.get("density"):
        # The best platform's count; each platform's run is kept beside it.
        res["density"] = {"systrap": m["density"], "systrap+auto-pause": m.get("density_autopause"),
                          "ptrace": m.get("density_ptrace")}
        res["max_idle_sandboxes_autopause"] = (m.get("density_autopause") or {}).get("max_idle_sandboxes")
        res["max_idle_sandboxes_systrap"] = m["density"]["max_idle_sandboxes"]
        res["max_idle_sandboxes_ptrace"] = (m.get("density_ptrace") or {}).get("max_idle_sandboxes")
        res["max_idle_sandboxes"] = max(res["max_idle_sandboxes_systrap"], res["max_idle_sandboxes_ptrace"] or 0)
    else:
        res["max_idle_sandboxes"] = None  # full mode only
    res["targets"] = {k: {"target": f"{op} {v:g}", "value": res[k], "met": _met(res[k], op, v)}
                      for k, (op, v) in TARGETS.items() if res.get(k) is not None}
    res["all_targets_met"] = all(t["met"] for t in res["targets"].values())
    res["host"] = {"cores": os.cpu_count(), "loadavg_start": m["load0"], "loadavg_end": list(os.getloadavg()),
                   "other_runsc_sandboxes_at_start": m["others"]}
    return res


def print_tier_table(res: dict[str, Any]) -> None:
    """The one table of tiers: TTFC, episodes/s per concurrency, idle PSS, CPU per episode."""
    names = {"gvisor": "rollbox gVisor from snapshot", "warm": "rollbox warm pool", "runc": "rollbox runc tier",
             "raw_runsc": "raw runsc restore", "raw_runc": "raw runc run", "subprocess": "subprocess (no isolation)"}
    concs = sorted({int(k[5:]) for t in res["tiers"].values() for k in t if k.startswith("eps_c")})
    head = ["tier", "TTFC p50 ms", "TTFC p99 ms", *[f"eps c={c}" for c in concs], "idle MiB", "CPU s/ep"]
    rows = []
    for key, t in res["tiers"].items():
        rows.append([names.get(key, key), f"{t['ttfc_p50_ms']}", f"{t['ttfc_p99_ms']}",
                     *[str(t.get(f"eps_c{c}", "-")) for c in concs],
                     "-" if t["idle_mib"] is None else str(t["idle_mib"]),
                     "-" if t["cpu_s_per_episode"] is None else str(t["cpu_s_per_episode"])])
    w = [max(len(x[i]) for x in [head, *rows]) for i in range(len(head))]
    line = "  ".join("{:<%d}" % n for n in w)
    print(line.format(*head))
    print(line.format(*("-" * n for n in w)))
    for row in rows:
        print(line.format(*row))
    print(f"ratios: TTFC rollbox/raw runsc {res['ratio_ttfc_vs_raw_runsc']}, rollbox/no isolation "
          f"{res['ratio_ttfc_vs_no_isolation']}; eps gVisor/no isolation {res['ratio_eps_vs_no_isolation']}, "
          f"runc/no isolation {res['ratio_runc_eps_vs_no_isolation']}; runc TTFC rollbox/raw runc "
          f"{res['ratio_runc_ttfc_vs_raw_runc']}")
    print(f"warm acquire p50 {res['warm_acquire_p50_ms']} ms (daemon hand-out {res['warm_acquire_daemon_p50_ms']} ms), "
          f"then first exec {res['warm_first_exec_p50_ms']} ms")
    if res.get("admission"):
        a = res["admission"]
        print(f"admission {a['episodes']} episodes @ {a['concurrency']}: {a['statuses']} in {a['seconds']} s; "
              f"TTFC p50 by decile {a['ttfc_p50_ms_by_decile']}")
    for platform, d in (res.get("density") or {}).items():
        if d:
            print(f"idle density ({platform}): {d['max_idle_sandboxes']} idle sandboxes before start latency "
                  f"doubled (stopped by {d['stopped_by']}; reference {d.get('reference_ttfc_p50_ms')} ms; "
                  f"batches {[(b['n'], b['ttfc_p50_ms']) for b in d['batches']]}"
                  + (f"; resume of a paused one p50 {d['resume_p50_ms']} ms" if d.get("resume_p50_ms") else "") + ")")
    print()


def print_table(res: dict[str, Any], m: dict[str, Any], *, fork_n: int, idle_n: int,
                pool_runs: tuple[tuple[int, int], ...]) -> None:
    """The tables; `fork_n`, `idle_n` and `pool_runs` are the run's sizes (--quick changes them)."""
    FORK_N, IDLE_N, POOL_RUNS = fork_n, idle_n, pool_runs  # noqa: N806 - the names the rows use
    print_tier_table(res)
    rows: list[tuple[str, str, str, str]] = [
        ("cold TTFC p50 / p99 (ms)", f"{res['cold_ttfc_p50_ms']} / {res['cold_ttfc_p99_ms']}",
         f"{res['raw_runsc_cold_p50_ms']}", "raw: run -detach + exec true"),
        ("restore TTFC p50 / p99 (ms)", f"{res['restore_ttfc_p50_ms']} / {res['restore_ttfc_p99_ms']}",
         f"{res['raw_runsc_restore_p50_ms']}", "raw: restore -detach + exec true (mount excluded)"),
        ("  raw restore -detach alone (ms)", "-", f"{res['raw_runsc_restore_only_p50_ms']}", "p50, no exec"),
        ("restore overhead ratio", f"{res['restore_overhead_ratio']}", "1.0", "rollbox p50 / raw p50"),
        ("warm-pool TTFC p50 / p99 (ms)", f"{res['warm_restore_ttfc_p50_ms']} / {res['warm_restore_ttfc_p99_ms']}",
         "-", "4 spares restored ahead; acquire + exec true"),
        ("exec `true` p50 / p99 (ms)", f"{res['exec_p50_ms']} / {res['exec_p99_ms']}",
         f"{res['raw_runsc_exec_p50_ms']}", "rollbox: agent FIFO; raw: runsc exec"),
        ("  exec `true` vs spawn inside, p50 (ms)", f"{res['exec_paired_p50_ms']} / {res['in_sandbox_spawn_p50_ms']}",
         "-", f"+{res['exec_over_spawn_ms']} ms; paired blocks; spawn: posix_spawnp+wait in the sandbox (target <= 2)"),
        ("  of which HTTP / agent RTT (ms)", f"{res['http_rtt_p50_ms']} / {res['agent_rtt_p50_ms']}", "-",
         "GET /sandboxes/ID; fs.read_file (no spawn)"),
        ("exec fan-out execs/s, p50 / p99 (ms)", "{execs_per_s}, {p50_ms} / {p99_ms}".format(**res["exec_fanout"]), "-",
         "echo 1, {concurrency} at once across {sandboxes} sandboxes; {failed} failed".format(**res["exec_fanout"])),
        *(processes.rows(res["processes"]) if res.get("processes") else []),
        (f"fork({FORK_N}) wall (s)", f"{res['fork8_s']}", "-", ""),
        ("restore TTFC p50, networked (ms)", f"{res['net_restore_ttfc_p50_ms']}", "-",
         f"+{res['net_restore_extra_ms']} ms over loopback-only, interleaved (target <= 20)"),
        ("cold TTFC p50, networked (ms)", f"{res['net_cold_ttfc_p50_ms']}", "-",
         f"+{res['net_cold_extra_ms']} ms over loopback-only, interleaved"),
        ("boot from filesystem image p50 (ms)", f"{res['fs_image_boot_p50_ms']}", "-",
         "create_image_from_filesystem, then create + exec true (target < 1000)"),
    ]
    if res.get("net_churn"):
        c = res["net_churn"]
        rows.append((f"network churn ({c['cycles']} cycles)", f"leaked {c['leaked']}", "-",
                     f"{c['seconds']} s; netns {c['netns']}, links {c['links']}, nft {c['nft_elements']}, "
                     f"listeners {c['listeners']} (ready pool {c['ready']})"))
    for c, n in POOL_RUNS:
        raw = res.get(f"raw_runsc_episodes_per_s_c{c}")
        rows.append((f"episodes/s c={c} ({n} eps)", f"{res[f'episodes_per_s_c{c}']}",
                     "-" if raw is None else f"{raw}", "raw: mount+restore+exec+delete"))
    if m.get("ray"):
        rows.append(("episodes/s c=4, local vs Ray", f"{m['ray']['local_eps']} vs {m['ray']['ray_eps']}", "-",
                     f"ratio {m['ray']['ratio']} (target >= 0.8)"))
    rows += [
        (f"idle MiB/sandbox PSS ({IDLE_N})", f"{res['idle_mib']}", f"{res['raw_runsc_idle_mib']}",
         f"procs: {m['idle'].procs} vs {m['raw_idle'].procs}"),
        ("idle MiB/sandbox memcg", f"{res['idle_cgroup_mib']}", f"{res['raw_runsc_idle_cgroup_mib']}",
         "usage_in_bytes, page cache incl."),
        ("idle CPU % of a core/sandbox", f"{res['idle_cpu_pct']}", f"{res['raw_runsc_idle_cpu_pct']}",
         f"systrap, over {memory.IDLE_CPU_WINDOW_S:g} s"),
    ]
    if "ptrace_idle_cpu_pct" in res:
        rows.append(("  on ptrace: idle CPU % / PSS MiB", f"{res['ptrace_idle_cpu_pct']} / {res['ptrace_idle_mib']}",
                     "-", "ROLLBOX_PLATFORM=ptrace"))
    head = ("metric", "rollbox", "raw runsc", "note")
    w = [max(len(x[i]) for x in [head, *rows]) for i in range(4)]
    line = "  ".join("{:<%d}" % n for n in w)
    print(line.format(*head))
    print(line.format(*("-" * n for n in w)))
    for row in rows:
        print(line.format(*row))
    print()
    for k, t in res["targets"].items():
        print(f"target {k} {t['target']}: {t['value']} -> {'MET' if t['met'] else 'MISSED'}")
    print(f"host: {res['host']}")
    if res["episode_failures"]:
        print(f"WARNING: {res['episode_failures']} pool episodes did not finish ok")


