#!/usr/bin/env python3
"""Checks a recorded history of locks, semaphores and read-write locks: mutual exclusion, at
most N holders of a semaphore, never a writer beside another holder, fencing tokens, lost
updates.

Usage: check.py [--max-shown N] PATH...

PATH is a history file (JSON lines) or a directory whose *.jsonl files are read, one file per
process of the run. The checker shares no code with fencelock or with the recorder that wrote
the files (tests/support/recorder.rs): only the format, described in tests/checker/README.md,
which also says what each check means, where it follows Jepsen's knossos mutex model and
Hazelcast's fenced-mutex model, how the semaphore and read-write models extend them, and which
violations it can miss.

Prints the counts of each check and the first violations of each, then one line
`summary key=value ...` for programs. Exit status: 0 if no check found a violation, 1 if one
did, 2 if the history is malformed or the arguments are wrong. Python 3.6+, standard library
only.
"""

import glob
import json
import os
import sys
from collections import defaultdict

COMPLETIONS = ("ok", "fail", "unknown")
CLIENT_FS = ("acquire", "release", "incr", "read")
NEMESIS_FS = ("pause-client", "pause-server", "partition", "kill-client", "restart-server", "failover")
# The faults of tests/history/deployments.rs: clock steps and skews, crashes, CPU throttling,
# Cluster slot migrations.
NEMESIS_FS += ("clock-step", "clock-skew", "kill", "throttle-client", "migrate")


class Malformed(Exception):
    pass


def ms(ns, origin):
    return "%.3fs" % ((ns - origin) / 1e9)


def load(paths):
    """Every line of every file, as (file, line number, dict), in file order."""
    files = []
    for path in paths:
        if os.path.isdir(path):
            files.extend(sorted(glob.glob(os.path.join(path, "*.jsonl"))))
        else:
            files.append(path)
    if not files:
        raise Malformed("no history files in %s" % ", ".join(paths))
    events = []
    for name in files:
        with open(name, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                line = line.strip()
                if not line:
                    continue
                try:
                    e = json.loads(line)
                except ValueError as err:
                    raise Malformed("%s:%d: not JSON (%s): %r" % (name, n, err, line[:200]))
                for field in ("process", "type", "f", "time"):
                    if field not in e:
                        raise Malformed("%s:%d: no %r: %r" % (name, n, field, line[:200]))
                if not isinstance(e["time"], int):
                    raise Malformed("%s:%d: time is not an integer" % (name, n))
                e["_where"] = "%s:%d" % (os.path.basename(name), n)
                events.append(e)
    return files, events


def pair(events):
    """Operations: each invoke joined with the next completion of the same process.

    An invocation with no completion (the process died) counts as unknown. Returns the list of
    operations (dicts with inv and end times, type, and the fields of both lines) and the
    nemesis operations.
    """
    open_ops = {}
    ops = []
    for e in events:
        proc, kind, f = e["process"], e["type"], e["f"]
        if kind == "info":
            continue
        if kind == "invoke":
            if proc in open_ops:
                raise Malformed(
                    "%s: %s invokes %s while its %s (%s) is still open"
                    % (e["_where"], proc, f, open_ops[proc]["f"], open_ops[proc]["_where"])
                )
            open_ops[proc] = e
            continue
        if kind not in COMPLETIONS:
            raise Malformed("%s: unknown type %r" % (e["_where"], kind))
        inv = open_ops.pop(proc, None)
        if inv is None or inv["f"] != f:
            raise Malformed("%s: %s completes %s it did not invoke" % (e["_where"], proc, f))
        if e["time"] < inv["time"]:
            raise Malformed("%s: %s completes %s before invoking it" % (e["_where"], proc, f))
        op = dict(inv)
        op.update(e)
        op["inv"] = inv["time"]
        op["end"] = e["time"]
        op["key"] = inv.get("key")
        op["last_held"] = inv.get("last_held", e.get("last_held"))
        ops.append(op)
    for proc, inv in open_ops.items():
        op = dict(inv)
        op.update({"type": "unknown", "inv": inv["time"], "end": None,
                   "error": "never completed"})
        ops.append(op)
    ops.sort(key=lambda o: o["inv"])
    client = [o for o in ops if o["f"] in CLIENT_FS]
    nemesis = [o for o in ops if o["f"] in NEMESIS_FS]
    other = [o for o in ops if o["f"] not in CLIENT_FS and o["f"] not in NEMESIS_FS]
    if other:
        raise Malformed("%s: unknown operation %r" % (other[0]["_where"], other[0]["f"]))
    return client, nemesis


def holds_of(ops):
    """The certain holds: from an ok acquire to the last time its holder saw is_held() true.

    The hold of an acquire is ended by the next release of the same process and key, whose
    invocation carries last_held. A grant never released (the process died holding it) is a
    hold of zero length at its grant: nothing is known about how long it was seen held.
    """
    holds = []
    open_hold = {}
    kinds = {}  # key -> (kind, permits, where first seen)
    for o in sorted(ops, key=lambda o: o["inv"]):
        if o["f"] == "acquire":
            kind, permits = kind_of(o)
            seen = kinds.setdefault(o["key"], (kind, permits, o["_where"]))
            if seen[:2] != (kind, permits):
                raise Malformed(
                    "%s: key %r acquired as a %s%s, but as a %s%s at %s"
                    % (o["_where"], o["key"], kind, " of %s" % permits if permits else "",
                       seen[0], " of %s" % seen[1] if seen[1] else "", seen[2]))
        if o["f"] == "acquire" and o["type"] == "ok":
            if "token" not in o or not isinstance(o["token"], int):
                raise Malformed("%s: an ok acquire without a token" % o["_where"])
            h = {"key": o["key"], "process": o["process"], "token": o["token"],
                 "start": o["end"], "end": o["end"], "where": o["_where"], "inv": o["inv"],
                 "kind": kind, "permits": permits, "mode": o.get("mode")}
            holds.append(h)
            open_hold[(o["process"], o["key"])] = h
        elif o["f"] == "release":
            h = open_hold.pop((o["process"], o["key"]), None)
            if h is None:
                continue  # a release after an unknown acquire: no hold to end
            last = o.get("last_held")
            if last is None:
                raise Malformed("%s: a release without last_held" % o["_where"])
            if last < h["start"]:
                raise Malformed("%s: last_held before the grant at %s" % (o["_where"], h["where"]))
            h["end"] = last
    return holds


def kind_of(o):
    """What an acquire takes: ("lock", None), ("semaphore", n) or ("rw", None)."""
    permits, mode = o.get("permits"), o.get("mode")
    if permits is not None and mode is not None:
        raise Malformed("%s: an acquire with both permits and a mode" % o["_where"])
    if permits is not None:
        if not isinstance(permits, int) or isinstance(permits, bool) or permits < 1:
            raise Malformed("%s: permits is not a positive integer" % o["_where"])
        return "semaphore", permits
    if mode is not None:
        if mode not in ("read", "write"):
            raise Malformed("%s: mode is neither read nor write: %r" % (o["_where"], mode))
        return "rw", None
    return "lock", None


def by_key_of(holds, kind):
    """The holds of each key of one kind, as a dict key -> list."""
    by_key = defaultdict(list)
    for h in holds:
        if h["kind"] == kind:
            by_key[h["key"]].append(h)
    return by_key


def describe(h, origin):
    what = {"lock": "", "semaphore": "a permit, ", "rw": "%s, " % h["mode"]}[h["kind"]]
    return "%s (%stoken %d, [%s .. %s])" % (h["process"], what, h["token"],
                                             ms(h["start"], origin), ms(h["end"], origin))


def check_mutex(holds, origin, shown):
    """Two certain holds of one key that overlap: no order of the operations explains them."""
    violations = []
    by_key = by_key_of(holds, "lock")
    for key in sorted(by_key):
        latest = None  # the hold with the latest end so far
        for h in sorted(by_key[key], key=lambda h: (h["start"], h["end"])):
            if latest is not None and h["start"] < latest["end"]:
                violations.append(
                    "key %r: %s holds it [%s .. %s] (token %d) and %s is granted it at %s "
                    "(token %d, seen held until %s)"
                    % (key, latest["process"], ms(latest["start"], origin),
                       ms(latest["end"], origin), latest["token"], h["process"],
                       ms(h["start"], origin), h["token"], ms(h["end"], origin)))
            if latest is None or h["end"] > latest["end"]:
                latest = h
    return violations


def check_semaphore(holds, origin):
    """More than n certain holds of a semaphore of n permits at one instant.

    A sweep over the starts and ends of the certain holds, an end before a start at the same
    instant (holds that only touch do not overlap). One violation per start that lifts the count
    above n.
    """
    violations = []
    for key, hs in sorted(by_key_of(holds, "semaphore").items()):
        n = hs[0]["permits"]
        points = []
        for i, h in enumerate(hs):
            points.append((h["start"], 1, i))
            points.append((h["end"], 0, i))
        active = set()
        for _, is_start, i in sorted(points):
            if not is_start:
                active.discard(i)
                continue
            if hs[i]["end"] == hs[i]["start"]:
                continue  # a hold of no length overlaps nothing
            active.add(i)
            if len(active) > n:
                others = sorted(active - {i}, key=lambda j: hs[j]["start"])
                violations.append(
                    "semaphore %r of %d: %s is granted while %d others hold: %s"
                    % (key, n, describe(hs[i], origin), len(others),
                       ", ".join(describe(hs[j], origin) for j in others[:n + 1])))
    return violations


def check_rw(holds, origin):
    """A write's certain hold overlapping any other certain hold of the same read-write lock.

    By start: a write conflicts with the latest-ending hold of any mode before it, a read with
    the latest-ending write before it; every overlapping pair with a write in it is so found at
    its later start (one violation per such start).
    """
    violations = []
    for key, hs in sorted(by_key_of(holds, "rw").items()):
        latest_any = latest_write = None
        for h in sorted(hs, key=lambda h: (h["start"], h["end"])):
            other = latest_any if h["mode"] == "write" else latest_write
            if other is not None and h["start"] < other["end"] and h["start"] < h["end"]:
                violations.append("read-write lock %r: %s is granted while %s holds"
                                  % (key, describe(h, origin), describe(other, origin)))
            if latest_any is None or h["end"] > latest_any["end"]:
                latest_any = h
            if h["mode"] == "write" and (latest_write is None or h["end"] > latest_write["end"]):
                latest_write = h
    return violations


def check_grant_order(holds, origin):
    """A grant whose acquire was invoked after another grant returned must carry a higher token.

    Every kind promises tokens strictly rising in the order of grants, per key: the earlier
    grant took effect before its call returned, the later one after its call was invoked.
    """
    violations = []
    by_key = defaultdict(list)
    for h in holds:
        by_key[h["key"]].append(h)
    for key in sorted(by_key):
        hs = by_key[key]
        by_start = sorted(hs, key=lambda h: h["start"])
        best = None  # the highest-token grant among those returned before the current invocation
        i = 0
        for h in sorted(hs, key=lambda h: h["inv"]):
            while i < len(by_start) and by_start[i]["start"] < h["inv"]:
                if best is None or by_start[i]["token"] > best["token"]:
                    best = by_start[i]
                i += 1
            if best is not None and h["token"] <= best["token"]:
                violations.append((h, 
                    "key %r: %s is granted token %d by a call invoked at %s, after %s was "
                    "granted token %d at %s"
                    % (key, h["process"], h["token"], ms(h["inv"], origin), best["process"],
                       best["token"], ms(best["start"], origin))))
    return violations


def check_rw_fences(holds, origin):
    """Of two holds of a read-write lock, one a write, the later must carry the higher token.

    Under the read-write model a hold that began after another with a write in the pair ended
    was granted after it (were it granted before, the two would have held together), so its
    token is higher. Two reads may hold together: the grant-order check covers those.
    """
    violations = []
    for key, hs in sorted(by_key_of(holds, "rw").items()):
        by_end = sorted(hs, key=lambda h: h["end"])
        best_any = best_write = None  # among the holds that ended before the current start
        i = 0
        for h in sorted(hs, key=lambda h: h["start"]):
            while i < len(by_end) and by_end[i]["end"] < h["start"]:
                e = by_end[i]
                if best_any is None or e["token"] > best_any["token"]:
                    best_any = e
                if e["mode"] == "write" and (best_write is None or e["token"] > best_write["token"]):
                    best_write = e
                i += 1
            best = best_any if h["mode"] == "write" else best_write
            if best is not None and h["token"] <= best["token"]:
                violations.append((h, "read-write lock %r: %s, after %s ended"
                                   % (key, describe(h, origin), describe(best, origin))))
    return violations


def check_fences(holds, origin, shown):
    """A hold that certainly came after another of its key must carry a higher token."""
    violations = []
    by_key = by_key_of(holds, "lock")
    for key in sorted(by_key):
        hs = by_key[key]
        by_end = sorted(hs, key=lambda h: h["end"])
        best = None  # the highest-token hold among those that ended before the current start
        i = 0
        for h in sorted(hs, key=lambda h: h["start"]):
            while i < len(by_end) and by_end[i]["end"] < h["start"]:
                if best is None or by_end[i]["token"] > best["token"]:
                    best = by_end[i]
                i += 1
            if best is not None and h["token"] <= best["token"]:
                violations.append((h,
                    "key %r: %s is granted token %d at %s, after %s held token %d until %s"
                    % (key, h["process"], h["token"], ms(h["start"], origin),
                       best["process"], best["token"], ms(best["end"], origin))))
    return violations


def check_lost_updates(ops, origin):
    """Per key: the final value against the increments that succeeded.

    Returns (per-key rows, violations, lost in all, successful increments in all). An increment whose write is unknown may
    or may not have been applied; one that failed was not.
    """
    rows, violations, lost_total, ok_total = [], [], 0, 0
    incr = defaultdict(list)
    reads = defaultdict(list)
    for o in ops:
        if o["f"] == "incr":
            incr[o["key"]].append(o)
        elif o["f"] == "read" and o["type"] == "ok":
            reads[o["key"]].append(o)
    for key in sorted(incr):
        ups = incr[key]
        ok = [o for o in ups if o["type"] == "ok"]
        unknown = sum(1 for o in ups if o["type"] == "unknown")
        failed = sum(1 for o in ups if o["type"] == "fail")
        first_inv = min(o["inv"] for o in ups)
        last_end = max((o["end"] or o["inv"]) for o in ups)
        before = [r for r in reads[key] if r["end"] <= first_inv]
        after = [r for r in reads[key] if r["inv"] >= last_end]
        if not after:
            raise Malformed("key %r: no read of the final value after the last increment" % key)
        initial = max(before, key=lambda r: r["end"])["value"] if before else 0
        final = max(after, key=lambda r: r["end"])["value"]
        if not isinstance(final, int) or not isinstance(initial, int):
            raise Malformed("key %r: a read without an integer value" % key)
        for o in ok:
            if not isinstance(o.get("value"), int):
                raise Malformed("%s: an ok incr without the value it wrote" % o["_where"])
        delta = final - initial
        # Two successful increments that wrote the same value read the same value: one of
        # them overwrote the other (a serial history writes initial+1, initial+2, ... once each).
        written = defaultdict(list)
        for o in ok:
            written[o["value"]].append(o)
        duplicates = len(ok) - len(written)
        lost = max(0, len(ok) - delta, duplicates)
        lost_total += lost
        ok_total += len(ok)
        rows.append("key %r: %d increments ok, %d unknown, %d failed; %d -> %d; lost %d"
                    % (key, len(ok), unknown, failed, initial, final, lost))
        if len(ok) > delta:
            violations.append(
                "key %r: %d increments succeeded but the value rose by %d (%d -> %d): "
                "at least %d lost" % (key, len(ok), delta, initial, final, len(ok) - delta))
        if delta > len(ok) + unknown:
            violations.append(
                "key %r: the value rose by %d, more than the %d increments that succeeded or "
                "may have" % (key, delta, len(ok) + unknown))
        for value in sorted(written):
            same = written[value]
            if len(same) > 1:
                violations.append(
                    "key %r: %d successful increments all wrote %d: %s"
                    % (key, len(same), value, ", ".join(
                        "%s at %s" % (o["process"], ms(o["end"], origin)) for o in same[:4])))
    return rows, violations, lost_total, ok_total


def main(argv):
    shown = 5
    paths = []
    args = list(argv)
    while args:
        a = args.pop(0)
        if a == "--max-shown" and args:
            shown = int(args.pop(0))
        elif a in ("-h", "--help"):
            print(__doc__)
            return 0
        elif a.startswith("-"):
            print("unknown option %s\n%s" % (a, __doc__), file=sys.stderr)
            return 2
        else:
            paths.append(a)
    if not paths:
        print(__doc__, file=sys.stderr)
        return 2
    try:
        files, events = load(paths)
        ops, nemesis = pair(events)
        holds = holds_of(ops)
        origin = min(e["time"] for e in events)
        mutex = check_mutex(holds, origin, shown)
        semaphore = check_semaphore(holds, origin)
        rw = check_rw(holds, origin)
        # A grant may break more than one token rule: it counts once, with the first reason.
        regressed = {}
        for h, why in (check_fences(holds, origin, shown) + check_rw_fences(holds, origin)
                       + check_grant_order(holds, origin)):
            regressed.setdefault(id(h), why)
        fences = list(regressed.values())
        rows, lost_violations, lost, increments = check_lost_updates(ops, origin)
    except Malformed as err:
        print("malformed history: %s" % err, file=sys.stderr)
        return 2

    count = lambda kind: sum(1 for o in ops if o["type"] == kind)
    grants = sum(1 for o in ops if o["f"] == "acquire" and o["type"] == "ok")
    faults = defaultdict(int)
    for o in nemesis:
        if o["type"] == "ok":
            faults[o["f"]] += 1
    print("history: %d files, %d lines, %d operations (%d ok, %d fail, %d unknown)"
          % (len(files), len(events), len(ops), count("ok"), count("fail"), count("unknown")))
    print("faults: %s" % (", ".join("%s %d" % kv for kv in sorted(faults.items())) or "none"))
    of = lambda kind: [h for h in holds if h["kind"] == kind]
    print("mutex: %d holds on %d keys, %d grants; %d overlapping"
          % (len(of("lock")), len(set(h["key"] for h in of("lock"))), grants, len(mutex)))
    print("semaphore: %d holds on %d semaphores; %d grants beyond the permits"
          % (len(of("semaphore")), len(set(h["key"] for h in of("semaphore"))),
             len(semaphore)))
    print("read-write: %d holds (%d writes) on %d locks; %d beside a writer"
          % (len(of("rw")), sum(1 for h in of("rw") if h["mode"] == "write"),
             len(set(h["key"] for h in of("rw"))), len(rw)))
    print("fenced: %d holds; %d token regressions" % (len(holds), len(fences)))
    print("locked set: %s" % ("no increments" if not rows else "%d keys" % len(rows)))
    for row in rows:
        print("  " + row)
    for title, vs in (("mutex violations", mutex), ("semaphore violations", semaphore),
                      ("read-write violations", rw), ("token regressions", fences),
                      ("lost updates", lost_violations)):
        if vs:
            print("%s (first %d of %d):" % (title, min(shown, len(vs)), len(vs)))
            for v in vs[:shown]:
                print("  - " + v)
    print("summary ops=%d grants=%d unknown=%d faults=%d increments=%d mutex_violations=%d "
          "semaphore_violations=%d rw_violations=%d token_regressions=%d lost_updates=%d"
          % (len(ops), grants, count("unknown"), sum(faults.values()), increments, len(mutex),
             len(semaphore), len(rw), len(fences), lost))
    return 1 if (mutex or semaphore or rw or fences or lost_violations) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
