"""The comparison `stepscope.serializer: "compare"` is for: stepscope's trace of a save against
Kineto's own writing of the same save (`{stem}.kineto.json`). The two must hold the same header
but the file each names itself by (`traceName`), and the same events, each as often, to the
value. Used by scripts/check_wheel.sh (torch 2.15, the installed wheel) and
scripts/gpu_serializer_check.py (CUDA captures); tests/python/test_kineto_writer.py asserts the
same under torch 2.13 and 2.14."""

from __future__ import annotations

import collections
import json

#: Header keys the two traces may differ in: the events (compared as a multiset) and the file
#: each names itself by.
NOT_HEADER = ("traceEvents", "traceName")


def events(trace: dict) -> collections.Counter:
    """Each event (as canonical JSON) and how often it occurs."""
    return collections.Counter(json.dumps(e, sort_keys=True) for e in trace["traceEvents"])


def compare(ours: dict, kineto: dict) -> dict:
    """How two parsed traces differ: the header keys that differ, whether the events are the
    same, how many Kineto's holds, and the first few events only one of them holds."""
    header = sorted(k for k in set(ours) | set(kineto) if k not in NOT_HEADER and ours.get(k) != kineto.get(k))
    a, b = events(ours), events(kineto)
    return {
        "same_header": not header,
        "header_differs": header,
        "same_events": a == b,
        "events": sum(b.values()),
        "only_ours": [k[:400] for k in list((a - b).elements())[:3]],
        "only_kineto": [k[:400] for k in list((b - a).elements())[:3]],
    }
