#!/usr/bin/env python3
"""Self-test of the soak's accounting (checker.py) on made-up event logs: a clean run
passes, and each kind of broker fault the soak is meant to catch is reported.
Standard library only: python3 scripts/soak/test_checker.py (exit status 0 = all hold).
"""
import os
import sys

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import checker  # noqa: E402

CH = {"t": ["c"]}
TO = 3.0


def base():
    """Three messages on topic t, all delivered on channel c and FINed; m2 once REQed."""
    ev = [dict(e="op", t=0.0, t0=0.0, t1=0.0, op="setup", topic="t", ch="c", code=200)]
    for i, b in enumerate(("m1", "m2", "m3")):
        t = 1.0 + i
        ev.append(dict(e="pub", t=t, t0=t, t1=t + 0.01, topic="t", bodies=[b], via="x-pub", ok=True, err=None))
        ev.append(dict(e="dlv", t=t + 0.1, topic="t", ch="c", r="r1", body=b, id="id%d" % i, att=1))
        if b == "m2":
            ev.append(dict(e="req", t=t + 0.11, topic="t", ch="c", r="r1", body=b, id="id1", held=0.01,
                           delay_ms=0))
            ev.append(dict(e="dlv", t=t + 0.2, topic="t", ch="c", r="r1", body=b, id="id1", att=2))
        ev.append(dict(e="fin", t=t + 0.3, topic="t", ch="c", r="r1", body=b, id="id%d" % i, held=0.01))
    return ev


def run(ev):
    fig, problems, _, _, _ = checker.check(sorted(ev, key=lambda e: e["t"]), CH, TO)
    return fig, problems


def main():
    failures = []

    def expect(name, ev, **want):
        fig, problems = run(ev)
        got = {k: fig[k] for k in want}
        ok = got == want and (bool(problems) == any(want.values()))
        print("%-50s %s %s" % (name, "ok" if ok else "WRONG", got))
        if not ok:
            failures.append(name)

    expect("clean run", base(), unaccounted=0, faults=0, errors_unexpected=0)
    ev = [e for e in base() if not (e["e"] == "fin" and e["body"] == "m3")]
    expect("a message never FINed", ev, unaccounted=1, faults=0, errors_unexpected=0)
    ev = [e for e in base() if not (e.get("body") == "m3" and e["e"] in ("dlv", "fin"))]
    ev.append(dict(e="op", t=5.0, t0=5.0, t1=5.1, op="channel_empty", topic="t", ch="c", code=200))
    expect("... removed by a later /channel/empty", ev, unaccounted=0, faults=0, errors_unexpected=0)
    ev = [e for e in base() if not (e.get("body") == "m3" and e["e"] in ("dlv", "fin"))]
    ev.append(dict(e="op", t=2.9, t0=2.9, t1=3.2, op="channel_delete", topic="t", ch="c", code=200))
    expect("... published during a delete window", ev, unaccounted=0, faults=0, errors_unexpected=0)
    ev = base() + [dict(e="dlv", t=9.0, topic="t", ch="c", r="r1", body="m1", id="id0", att=2)]
    expect("a redelivery after a successful FIN", ev, unaccounted=0, faults=1, errors_unexpected=0)
    ev = base() + [dict(e="dlv", t=9.0, topic="t", ch="c", r="r1", body="zz", id="idz", att=1)]
    expect("a body never published", ev, unaccounted=0, faults=1, errors_unexpected=0)
    ev = base() + [dict(e="dlv", t=1.15, topic="t", ch="c", r="r2", body="m1", id="id0", att=1)]
    expect("two first deliveries", ev, unaccounted=0, faults=1, errors_unexpected=0)
    ev = base() + [dict(e="err", t=1.35, topic="t", ch="c", r="r1", id="id0", held=0.3, ours=False,
                        text="E_FIN_FAILED FIN id0 failed ID not in flight")]
    expect("E_FIN_FAILED out of the blue", ev, unaccounted=1, faults=0, errors_unexpected=1)
    ev = base() + [dict(e="err", t=4.5, topic="t", ch="c", r="r1", id="id0", held=3.2, ours=False,
                        text="E_FIN_FAILED FIN id0 failed ID not in flight")]
    expect("E_FIN_FAILED after holding past msg_timeout", ev[:-1] + [dict(ev[-1], t=1.35)],
           unaccounted=1, faults=0, errors_unexpected=0)
    ev = base() + [dict(e="close", t=2.5, topic="t", ch="c", r="r1", ours=False)]
    expect("a connection the broker closed", ev, unaccounted=0, faults=0, errors_unexpected=1)
    ev.append(dict(e="op", t=2.4, t0=2.4, t1=2.6, op="channel_delete", topic="t", ch="c", code=200))
    expect("... while the channel was deleted", ev, unaccounted=0, faults=0, errors_unexpected=0)
    ev = base() + [dict(e="pub", t=6.0, t0=6.0, t1=6.1, topic="t", bodies=["m9"], via="x-pub", ok=False,
                        err="E_PUB_FAILED")]
    expect("a failed publish", ev, unaccounted=0, faults=0, errors_unexpected=1)
    print("checker self-test: %s" % ("PASS" if not failures else "FAIL: %s" % failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
