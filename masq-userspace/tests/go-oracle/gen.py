#!/usr/bin/env python3
"""Writes the documents of the Go oracle corpus (`gen.py corpus`), or the single-routine inputs
(`gen.py routines`, see routines() at the end), one JSON object per line, to stdout.

Each line is {"doc": base64 of the file's bytes, "ipv6": --enable-ipv6, "reserved":
--nomasq-all-reserved-ranges}. main.go runs upstream's pipeline on each and records what Go
says. The output is deterministic (fixed seed), so regenerating the corpus only changes it
when this script, the seeds or the Go packages change.

Documents come from five places: seeds.json (inputs of masq's own tests over the years),
FORMER_TESTS (the documents of unit tests whose assertions now live here), config-shaped
documents built from lists of interesting keys, values and layouts, mutations of those
(characters inserted, deleted or replaced, bytes that are not UTF-8) that exercise the error
paths and their wording, and MASQ_KEYS (documents using masq's own keys, which upstream
ignores).
"""

import base64
import json
import os
import random
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
rng = random.Random(20240612)
out = []


def emit(doc, ipv6=False, reserved=False):
    if isinstance(doc, str):
        doc = doc.encode("utf-8", "surrogatepass")
    out.append((doc, ipv6, reserved))


# ---------------------------------------------------------------------------------------------
# Seeds, each with the default flags and with IPv6 enabled.
with open(os.path.join(HERE, "seeds.json"), encoding="utf-8") as seeds:
    for doc in json.load(seeds):
        emit(doc)
        emit(doc, ipv6=True, reserved=True)

# ---------------------------------------------------------------------------------------------
# Cases of masq's former unit tests, whole documents with the flags they were checked under;
# their assertions now hold against Go itself. (ipv6, reserved) default to (False, False).
FORMER_TESTS = {
    # config::tests::defaults_follow_upstream
    "{}": [(False, False), (False, True)],
    # config::source::tests::yaml_and_json_read_the_same
    "nonMasqueradeCIDRs:\n  - 172.16.0.0/12\n  - 10.0.0.0/8\ncidrLimit: 64\nmasqLinkLocal: true\n"
    "resyncInterval: 5s\n": [],
    '{"nonMasqueradeCIDRs":["172.16.0.0/12","10.0.0.0/8"],"cidrLimit":64,"masqLinkLocal":true,'
    '"resyncInterval":"5s"}': [],
    '{"resyncInterval":"\\u0035\\u006d"}': [],
    # config::source::tests::partial_files_keep_defaults_for_absent_keys
    "masqLinkLocal: true\n": [],
    "nonMasqueradeCIDRs:\n  - 192.168.0.0/16\n": [],
    # config::source::tests::an_explicit_empty_list_is_logged_as_go_logs_it (a nil list is
    # null in the corpus, an empty one [])
    "nonMasqueradeCIDRs: []\n": [],
    '{"nonMasqueradeCIDRs": []}': [],
    "nonMasqueradeCIDRs:\n": [],
    '{"nonMasqueradeCIDRs": null}': [],
    # config::source::tests::bad_files_report_upstream_messages
    "*": [],
    "{*": [],
    "nonMasqueradeCIDRs:\n  - 10.0.0.1/8\n": [],
    "nonMasqueradeCIDRs:\n  - fc00::/7\n": [],
    "nonMasqueradeCIDRs:\n  -\n  - 1.0.0.0/8\n": [],
    # config::decode::tests::absent_keys_keep_defaults
    '{"masqLinkLocal": true}': [],
    '{"foo": 1, "nonMasqueradeCidrsX": null}': [],
    # config::decode::tests::keys_match_case_insensitively_with_exact_match_preferred
    '{"NONMASQUERADECIDRS": ["1.0.0.0/8"], "CidrLimit": 5, "masqlinklocalipv6": true}': [],
    '{"cidrLimit": 1, "CIDRLIMIT": 2}': [],
    # config::decode::tests::null_empties_the_list_but_not_scalars
    '{"nonMasqueradeCIDRs": null, "cidrLimit": null, "masqLinkLocal": null}': [],
    # config::decode::tests::null_list_elements_keep_the_default_at_their_index
    '{"nonMasqueradeCIDRs": [null, "1.0.0.0/8", null]}': [],
    '{"nonMasqueradeCIDRs": [null, "1.0.0.0/8", null, null]}': [],
    # config::decode::tests::type_errors_use_go_messages
    '{"cidrLimit": "64"}': [],
    '{"cidrLimit": 1.5}': [],
    '{"cidrLimit": 64.0}': [],
    '{"cidrLimit": 99999999999999999999}': [],
    '{"masqLinkLocal": "true"}': [],
    '{"masqLinkLocal": 1}': [],
    '{"nonMasqueradeCIDRs": "10.0.0.0/8"}': [],
    '{"nonMasqueradeCIDRs": [10]}': [],
    '{"resyncInterval": 60}': [],
    '{"resyncInterval": null}': [],
    '{"resyncInterval": "abc"}': [],
    "[]": [],
    # config::decode::tests::first_type_error_wins_unless_a_duration_fails
    '{"cidrLimit": "x", "masqLinkLocal": "y"}': [],
    '{"cidrLimit": "x", "resyncInterval": "bad"}': [],
    # config::decode::tests::durations_are_go_strings
    '{"resyncInterval": "5m"}': [],
    # config::validate::tests::upstream_config_validate_cases
    '{"nonMasqueradeCIDRs": [], "cidrLimit": 64}': [],
    '{"nonMasqueradeCIDRs": ["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"], '
    '"cidrLimit": 64}': [],
    '{"nonMasqueradeCIDRs": ["abcdefg"], "cidrLimit": 64}': [],
    '{"nonMasqueradeCIDRs": ["10.0.0.0/8", "abcdefg"], "cidrLimit": 64}': [],
    '{"nonMasqueradeCIDRs": ["10.256.0.0/16"], "cidrLimit": 64}': [],
    '{"nonMasqueradeCIDRs": ["10.0.0.1/8"], "cidrLimit": 64}': [],
    # config::validate::tests::the_limit_counts_everything_before_parsing
    json.dumps({"nonMasqueradeCIDRs": [f"10.{i}.0.0/16" for i in range(65)], "cidrLimit": 64}): [],
    json.dumps({"nonMasqueradeCIDRs": [f"10.{i}.0.0/16" for i in range(64)], "cidrLimit": 64}): [],
    '{"nonMasqueradeCIDRs": ["garbage", "fc00::/7"], "cidrLimit": 1}': [],
    '{"nonMasqueradeCIDRs": ["10.0.0.0/8"], "cidrLimit": 0}': [],
    '{"nonMasqueradeCIDRs": ["10.0.0.0/8"], "cidrLimit": -1}': [],
    '{"nonMasqueradeCIDRs": ["10.0.0.0/8", "10.0.0.0/8"], "cidrLimit": 64}': [],
    # config::validate::tests::ipv6_needs_the_flag
    '{"nonMasqueradeCIDRs": ["10.0.0.0/8", "fc00::/7"], "cidrLimit": 64}': [(False, False),
                                                                          (True, False)],
    '{"nonMasqueradeCIDRs": ["::ffff:10.0.0.0/104"], "cidrLimit": 64}': [],
    '{"nonMasqueradeCIDRs": ["fc00::/7", "bad"], "cidrLimit": 64}': [],
    # go_compat::json::tests::go_error_messages_end_of_input and go_error_messages: the cases
    # that are config files (apimachinery reads them as JSON, its first non-space is `{`)
    "{": [],
    '{"a"': [],
    '{"a":': [],
    '{"a":1': [],
    '{"X": "foo", "Y"}': [],
    '{"a" 1}': [],
    '{"X":12x}': [],
    "{*}": [],
    '{"a":1,}': [],
    "{'a':1}": [],
    '{"F3": -}': [],
    '{"a":01}': [],
    "{} {}": [],
    "{}x": [],
    "\x0c{}": [],
    "{}\x0b": [],
    "\u00a0{}": [],
    # go_compat::yaml::convert::tests::yaml_scalar_forms_match_go: a float, a timestamp and
    # !!binary reach the outcome as a list element (a number is a type error, a string a CIDR)
    "nonMasqueradeCIDRs: [-1.5e+3]\n": [],
    "nonMasqueradeCIDRs: [1e]\n": [],
    "nonMasqueradeCIDRs: [!!timestamp 2001-12-14t21:59:43.10-05:00]\n": [],
    "nonMasqueradeCIDRs: [!!timestamp 2004-02-29]\n": [],
    "nonMasqueradeCIDRs: [!!timestamp 2001-02-29]\n": [],
    "nonMasqueradeCIDRs: [!!timestamp 2001-12-14T21:59:43]\n": [],
    "nonMasqueradeCIDRs:\n  - !!binary |\n    aGVs\n    bG8=\n": [],
    "nonMasqueradeCIDRs: [!!binary aGk]\n": [],
    # go_compat::yaml::tests::the_simple_shape_reads_as_the_full_reader_does: documents of the
    # fast path's shape and near misses; go_compat::yaml::to_json checks in debug builds that
    # the fast path, where it takes a document, reads it as the full reader does
    "cidrLimit: 2\nnonMasqueradeCIDRs: [10.0.0.0/8, 1.0.0.0/8]\n": [],
    "nonMasqueradeCIDRs:\n- 10.0.0.0/8\n\nmasqLinkLocal: on\n": [],
    "a:\n    - x\n    - 0x1F\nb: [ y ,z]\na: []": [],
    "y: .inf\n1: 2\n": [],
    "null: x\n": [],
    "a: [x,]\n": [],
    "a:\n  - x\n   - y\n": [],
    "a:\n  - x\n  y\n": [],
    "a: [x]]\n": [],
    "a: x # comment\n": [],
    "a:\tx\n": [],
    "a: x\r\n": [],
    "- x\n": [],
    "a:\n": [],
    "---\na: x\n": [],
    "a: fc00::/7\n": [],
    "": [],
    # encoding/json folds the Kelvin sign to k when it matches keys to fields
    '{"masqLin\u212aLocal": true}': [],
    # Differences the oracle found: net.ParseCIDR takes any number of leading zeros in the
    # prefix; go-yaml v2 reads flow indicators (`,[]`) into a tag, where libyaml 0.2.5 ends it
    # (masq respells them as %XX for libyaml). The shapes around such a tag: in a flow
    # sequence or mapping, after an anchor, in block context, with an empty URI after a
    # handle, a verbatim tag, and `!` that is no tag (in a plain or quoted scalar).
    "nonMasqueradeCIDRs: [10.0.0.0/000000008]\n": [],
    "nonMasqueradeCIDRs: [!x, 10.0.0.0/8]\n": [],
    "nonMasqueradeCIDRs: [!x,10.0.0.0/8]\n": [],
    "nonMasqueradeCIDRs: [10.0.0.0/8,!x, 1.0.0.0/8]\n": [],
    "nonMasqueradeCIDRs: [!x]\n": [],
    "nonMasqueradeCIDRs: [!x[1.0.0.0/8], 10.0.0.0/8]\n": [],
    "nonMasqueradeCIDRs: [!!str, 10.0.0.0/8]\n": [],
    "nonMasqueradeCIDRs: [!a!, 10.0.0.0/8]\n": [],
    "nonMasqueradeCIDRs: [!<x,y> 10.0.0.0/8]\n": [],
    "nonMasqueradeCIDRs: [!<x>, 10.0.0.0/8]\n": [],
    "nonMasqueradeCIDRs: [&a !x, 10.0.0.0/8, *a]\n": [],
    "nonMasqueradeCIDRs: [&a\n  # c!\n  !x, 10.0.0.0/8]\n": [],
    "nonMasqueradeCIDRs: [!x &a, 10.0.0.0/8]\n": [],
    "nonMasqueradeCIDRs:\n- !x,\n- 10.0.0.0/8\n": [],
    "nonMasqueradeCIDRs:\n- !x,y\n- 10.0.0.0/8\n": [],
    "nonMasqueradeCIDRs:\n- !x[1]\n": [],
    "nonMasqueradeCIDRs: !x,\n": [],
    "x: {a: !x, b: c}\nnonMasqueradeCIDRs: [10.0.0.0/8]\n": [],
    "x: {a: !x}\nnonMasqueradeCIDRs: [10.0.0.0/8]\n": [],
    "nonMasqueradeCIDRs: {a: !x, b: c}\n": [],
    "nonMasqueradeCIDRs: [a!b, 10.0.0.0/8]\n": [],
    "nonMasqueradeCIDRs: [\"!x\", 10.0.0.0/8]\n": [],
    "nonMasqueradeCIDRs: ['!x,', 10.0.0.0/8]\n": [],
    "nonMasqueradeCIDRs: [x !y, 10.0.0.0/8]\n": [],
    # go_compat::yaml::tests::alias_chains_nesting_past_any_thread_stack_are_rejected_as_go_
    # rejects_them: each anchor nests the previous one 9,990 levels deeper, 40,000 in all.
    "".join(f"k{n}: &a{n} " + "[" * 9990 + ("0" if n == 0 else f"*a{n - 1}") + "]" * 9990 + "\n"
            for n in range(4)): [],
}
for doc, flags in FORMER_TESTS.items():
    for ipv6, reserved in flags or [(False, False)]:
        emit(doc, ipv6=ipv6, reserved=reserved)

# ---------------------------------------------------------------------------------------------
# Building blocks.
CIDRS = [
    "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "1.0.0.0/8", "0.0.0.0/0", "1.2.3.4/32",
    "10.0.0.0/08", "10.0.0.0/008", "10.0.0.1/8", "10.256.0.0/16", "abcdefg", "", " ",
    "010.0.0.0/8", "10.0.0.0", "10.0.0.0/", "10.0.0.0/33", "10.0.0.0/-1", "10.0.0.0/+8",
    "10.0.0/8", "10.0.0.0.0/8", " 10.0.0.0/8", "10.0.0.0/8 ", "10.0.0.0/0008x",
    "fc00::/7", "FC00::/7", "fd00::/8", "fe80::/10", "::/0", "fc00::1/7", "fe80::%eth0/64",
    "fe80::/129", "::ffff:10.0.0.0/104", "::ffff:10.0.0.0/8", "::ffff:0:0/96",
    "::ffff:010.0.0.0/104", "::ffff:10.0.0.1/104", "2001:db8::/32", "2001:db8::1/128",
    "2001:0db8:0000::/48", "::1.2.3.4/128", "1::2::3/64", "gggg::/16", "100.64.0.0/10",
    "240.0.0.0/4", "255.255.255.255/32", "10.0.0.0/8/8", "10.0.0.0\\8", "10.0.0.0 /8",
    "١٠.0.0.0/8", "10.0.0.0/８",
]
KEYS = {
    "nonMasqueradeCIDRs": ["nonMasqueradeCIDRs", "NONMASQUERADECIDRS", "nonmasqueradecidrs",
                           "NonMasqueradeCIDRs", "nonMasqueradeCIDRſ", "nonMasqueradeCIDR",
                           "nonMasqueradeCIDRs ", "non_masquerade_cidrs"],
    "cidrLimit": ["cidrLimit", "CIDRLIMIT", "CidrLimit", "cidrlimit", "cidr_limit"],
    "masqLinkLocal": ["masqLinkLocal", "MASQLINKLOCAL", "masqlinklocal", "MasqLinkLocal"],
    "masqLinkLocalIPv6": ["masqLinkLocalIPv6", "masqlinklocalipv6", "MASQLINKLOCALIPV6"],
    "resyncInterval": ["resyncInterval", "RESYNCINTERVAL", "resyncinterval", "ResyncInterval"],
}
INTS = ["64", "0", "1", "2", "3", "-1", "65", "0x10", "0X10", "0o17", "017", "08", "0b11",
        "1_000", "_1", "64.0", "6.4e1", "1e3", "1e400", "+5", "9223372036854775807",
        "9223372036854775808", "18446744073709551615", "-9223372036854775809", "'64'",
        '"64"', "~", "null", "yes", "true", "[]", "{}", ".inf", ".nan", "1.5", "!!int '3'",
        "!!str 3", "!!float 3", "0x", "3 # three", "!!binary MQ==", "1:20", "2001-12-14"]
BOOLS = ["true", "false", "True", "FALSE", "yes", "no", "Yes", "NO", "on", "off", "On", "OFF",
         "y", "n", "Y", "N", "1", "0", "'true'", '"yes"', "~", "null", "tRUE", "[]", "{}",
         "!!bool yes", "!!bool 1", "!!str true", "1.0", "enabled"]
DURATIONS = ["60s", "5m", "1m30s", "1h", "1.5h", "300ms", "2us", "2µs", "0", "0s", "-5s",
             "+1s", ".5s", "1.s", "60", "'60'", "60 s", "1x", "", "''", "~", "null", "abc",
             "9223372036854775807ns", "9223372036854775808ns", "3000000h", "1h1m1s1ms1us1ns",
             "[60s]", "{a: 1}", "true", "1e3", "0x10", "'5m'", '"5m"', "!!str 60",
             "!!int 60", "1d", "1é", "2001-12-14", "1:30", "-0", "1.5", "1h 30m"]


def scalar_styles(text):
    """`text` as a YAML plain, single-quoted and double-quoted scalar."""
    styles = ["'" + text.replace("'", "''") + "'",
              '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"']
    if text and text.strip() == text and not any(c in text for c in ":#[]{},&*!|>'\"%@`"):
        styles.append(text)
    return styles


def block_list(items, indent="  "):
    if not items:
        return " []\n"
    return "\n" + "".join(f"{indent}- {item}\n" for item in items)


def flow_list(items):
    return " [" + ", ".join(items) + "]\n"


def config_doc():
    """A config-shaped YAML document with random spellings, values and layout."""
    lines = []
    fields = list(KEYS)
    rng.shuffle(fields)
    for field in fields[: rng.randint(0, len(fields))]:
        key = rng.choice(KEYS[field]) if rng.random() < 0.3 else field
        if rng.random() < 0.1:
            key = rng.choice(scalar_styles(key))
        if field == "nonMasqueradeCIDRs":
            count = rng.choice([0, 1, 1, 2, 3, 5, 64, 65])
            items = []
            for _ in range(count):
                if rng.random() < 0.7:
                    cidr = rng.choice(CIDRS[:8]) if rng.random() < 0.6 else rng.choice(CIDRS)
                    item = rng.choice(scalar_styles(cidr))
                else:
                    item = rng.choice(["", "~", "null", "1", "true", "[]", "{}", "!!str 10.0.0.0/8",
                                       "&a 10.0.0.0/8", "*a", "10.0.0.0/8 # comment",
                                       "'10.0.0.0/8'", "!!binary MTAuMC4wLjAvOA=="])
                items.append(item)
            layout = rng.random()
            if layout < 0.45:
                lines.append(key + ":" + block_list(items, rng.choice(["  ", "", "    ", " "])))
            elif layout < 0.9:
                lines.append(key + ":" + flow_list(items))
            else:
                lines.append(key + ": " + rng.choice(["~", "null", "10.0.0.0/8", "''", "{}", "1"]) + "\n")
        elif field == "cidrLimit":
            lines.append(f"{key}: {rng.choice(INTS)}\n")
        elif field in ("masqLinkLocal", "masqLinkLocalIPv6"):
            lines.append(f"{key}: {rng.choice(BOOLS)}\n")
        else:
            lines.append(f"{key}: {rng.choice(DURATIONS)}\n")
    if rng.random() < 0.15:
        lines.insert(rng.randint(0, len(lines)), rng.choice(
            ["foo: bar\n", "# comment\n", "\n", "unknown: [1, 2]\n", "nested:\n  a: 1\n",
             "? complex\n: key\n", "<<: {cidrLimit: 2}\n", "cidrLimit: 1\n",
             "nonMasqueradeCIDRs: [9.0.0.0/8]\n", "1: one\n", "true: yes\n"]))
    doc = "".join(lines)
    if rng.random() < 0.1:
        doc = rng.choice(["---\n", "--- # doc\n", "%YAML 1.1\n---\n", "\ufeff", "# head\n"]) + doc
    if rng.random() < 0.1:
        doc += rng.choice(["---\nfoo: 1\n", "...\n", "--- ]]]\n", "# tail", "\n\n\n"])
    if rng.random() < 0.05:
        doc = doc.replace("\n", "\r\n")
    if rng.random() < 0.05:
        doc = doc.rstrip("\n")
    return doc


def json_doc():
    """A config-shaped JSON document (the JSON path of upstream's ToJSON)."""
    members = []
    fields = list(KEYS)
    rng.shuffle(fields)
    for field in fields[: rng.randint(0, len(fields))]:
        key = rng.choice(KEYS[field]) if rng.random() < 0.3 else field
        if field == "nonMasqueradeCIDRs":
            items = [json.dumps(rng.choice(CIDRS)) if rng.random() < 0.85 else
                     rng.choice(["null", "1", "true", "[]", "{}", '"\\u0031\\u0030.0.0.0/8"'])
                     for _ in range(rng.choice([0, 1, 2, 3, 65]))]
            value = "[" + ", ".join(items) + "]" if rng.random() < 0.9 else rng.choice(
                ["null", '"10.0.0.0/8"', "{}", "1"])
        elif field == "cidrLimit":
            value = rng.choice(["64", "0", "-1", "1.5", "64.0", "1e3", '"64"', "null", "true",
                                "99999999999999999999", "-0", "1E2", "[]", "012", "+1", "0x10"])
        elif field in ("masqLinkLocal", "masqLinkLocalIPv6"):
            value = rng.choice(["true", "false", "null", '"true"', "1", "0", "True", "[]"])
        else:
            value = rng.choice(['"60s"', '"5m"', '"\\u0035\\u006d"', "60", "null", '""',
                                '"abc"', '"1h30m"', "true", "[]", "{}", '"-1s"', '"0"'])
        members.append(json.dumps(key) + rng.choice([":", ": ", " : "]) + value)
    if rng.random() < 0.15:
        members.insert(rng.randint(0, len(members)), rng.choice(
            ['"foo": "bar"', '"a": {"b": [1, 2, {"c": null}]}', '"cidrLimit": 3']))
    doc = rng.choice(["{", " {", "\n\t{", "{\n  "]) + rng.choice([",", ",\n  ", ", "]).join(members) + "}"
    return doc + rng.choice(["", "\n", " ", "\r\n", "\n\n"])


for _ in range(1700):
    emit(config_doc(), ipv6=rng.random() < 0.3, reserved=rng.random() < 0.2)
for _ in range(500):
    emit(json_doc(), ipv6=rng.random() < 0.3, reserved=rng.random() < 0.2)

# ---------------------------------------------------------------------------------------------
# Every building block on its own, so each value is covered at least once.
for value in INTS:
    emit(f"cidrLimit: {value}\n")
for value in BOOLS:
    emit(f"masqLinkLocal: {value}\nmasqLinkLocalIPv6: {value}\n")
for value in DURATIONS:
    emit(f"resyncInterval: {value}\n")
for cidr in CIDRS:
    for style in scalar_styles(cidr):
        emit(f"nonMasqueradeCIDRs: [{style}]\n")
        emit(f"nonMasqueradeCIDRs:\n  - {style}\n", ipv6=True)
    emit(json.dumps({"nonMasqueradeCIDRs": [cidr]}), ipv6=True)
for fields in KEYS.values():
    for key in fields:
        emit(f"{key}: []\n")
        emit(json.dumps({key: None}))

# ---------------------------------------------------------------------------------------------
# YAML features and oddities, each on a small config.
FEATURES = [
    "a: &x 10.0.0.0/8\nnonMasqueradeCIDRs: [*x, *x]\n",
    "base: &b\n  cidrLimit: 1\nnonMasqueradeCIDRs: [1.0.0.0/8]\n<<: *b\n",
    "<<: [{cidrLimit: 1}, {cidrLimit: 2, masqLinkLocal: yes}]\n",
    "<<: {nonMasqueradeCIDRs: [1.0.0.0/8]}\nnonMasqueradeCIDRs: [2.0.0.0/8]\n",
    "nonMasqueradeCIDRs: !!seq [1.0.0.0/8]\ncidrLimit: !!int 5\n",
    "nonMasqueradeCIDRs: !!str [1.0.0.0/8]\n",
    "nonMasqueradeCIDRs: !custom [1.0.0.0/8]\nmasqLinkLocal: !custom true\n",
    "cidrLimit: 1\ncidrLimit: 2\nCIDRLIMIT: 3\n",
    "cidrLimit: 1\nCIDRLIMIT: 3\ncidrLimit: 2\n",
    "nonMasqueradeCIDRs:\n- 1.0.0.0/8\nNONMASQUERADECIDRS:\n- 2.0.0.0/8\n",
    "nonMasqueradeCIDRs: |\n  10.0.0.0/8\n",
    "resyncInterval: |-\n  5m\n",
    "resyncInterval: >\n  5m\n",
    "resyncInterval: \"5\\\n  m\"\n",
    "resyncInterval: '5\n  m'\n",
    "nonMasqueradeCIDRs:\n  - 10.0.0.0/8\n\t- 1.0.0.0/8\n",
    "nonMasqueradeCIDRs:\t[10.0.0.0/8]\n",
    "nonMasqueradeCIDRs: [10.0.0.0/8,\t1.0.0.0/8]\n",
    "\tcidrLimit: 1\n",
    "cidrLimit: 1\t# tab before comment\n",
    "\ufeffcidrLimit: 2\n",
    "cidrLimit: 2\n\ufeff",
    "cidrLimit: \ufeff2\n",
    "\ufeff\ufeffcidrLimit: 2\n",
    "\ufeff{\"cidrLimit\": 2}",
    "\u00a0{\"cidrLimit\": 2}",
    "\u0085{\"cidrLimit\": 2}",
    "\u2028{\"cidrLimit\": 2}",
    "\u3000{\"cidrLimit\": 2}",
    "\x0b{\"cidrLimit\": 2}",
    "\x0c{\"cidrLimit\": 2}",
    "cidrLimit: 2\u2028masqLinkLocal: true\n",
    "cidrLimit: 2\u2029masqLinkLocal: true\n",
    "cidrLimit: 2\u0085masqLinkLocal: true\n",
    "cidrLimit: 2\rmasqLinkLocal: true\r",
    "resyncInterval: \"\\x35m\"\n",
    "resyncInterval: \"\\u0035m\"\n",
    "resyncInterval: \"\\U00000035m\"\n",
    "resyncInterval: \"5\\tm\"\n",
    "resyncInterval: \"\\N\"\n",
    "resyncInterval: \"\\_\"\n",
    "resyncInterval: \"\\e\"\n",
    "resyncInterval: \"\\ \"\n",
    "resyncInterval: \"\\'\"\n",
    "resyncInterval: \"\\/\"\n",
    "resyncInterval: '5m''s'\n",
    "%YAML 1.1\n---\ncidrLimit: 3\n",
    "%YAML 1.2\n---\ncidrLimit: 3\n",
    "%YAML 1.0\n---\ncidrLimit: 3\n",
    "%YAML 2.0\n---\ncidrLimit: 3\n",
    "%YAML 1.1\n%YAML 1.1\n---\ncidrLimit: 3\n",
    "%TAG ! tag:example.com,2000:\n---\ncidrLimit: !foo 3\n",
    "%TAG !! tag:example.com,2000:\n---\ncidrLimit: !!int 3\n",
    "%FOO bar\n---\ncidrLimit: 3\n",
    "%YAML 1.1\ncidrLimit: 3\n",
    "--- cidrLimit\n",
    "--- !!map\ncidrLimit: 3\n",
    "--- &a\ncidrLimit: 3\n",
    "---\n---\ncidrLimit: 3\n",
    "...\ncidrLimit: 3\n",
    "cidrLimit: 3\n...\n...\n",
    "cidrLimit: 3\n--- \n",
    "cidrLimit: 3\n---\n%YAML 1.1\n---\n",
    "cidrLimit: 3\n...\n%YAML 1.1\n---\n",
    "? cidrLimit\n: 3\n",
    "? cidrLimit\n",
    "?\n",
    "? \n: \n",
    "cidrLimit: 3\n?",
    "cidrLimit: 3\n? ",
    "[cidrLimit, 3]\n",
    "- cidrLimit: 3\n",
    "cidrLimit\n",
    "\"cidrLimit\": 3\n",
    "'cidrLimit': 3\n",
    "cidrLimit : 3\n",
    "cidrLimit:3\n",
    "cidrLimit:  3  \n",
    "{cidrLimit: 3}\n",
    "!!map {cidrLimit: 3}\n",
    "&a {cidrLimit: 3}\n",
    "{ \"cidrLimit\": 3 }",
    "cidrLimit: 0x_10\n",
    "cidrLimit: 1__0\n",
    "cidrLimit: 0b1_0\n",
    "cidrLimit: -0b10\n",
    "cidrLimit: 0b-10\n",
    "cidrLimit: +0x10\n",
    "cidrLimit: -0x10\n",
    "cidrLimit: 1.0e+2\n",
    "cidrLimit: 1e2\n",
    "cidrLimit: 100.\n",
    "cidrLimit: .5e3\n",
    "cidrLimit: 2e-1\n",
    "cidrLimit: 1e21\n",
    "cidrLimit: 123456789012345678\n",
    "cidrLimit: 1234567890123456789012\n",
    "cidrLimit: -9223372036854775808\n",
    "cidrLimit: 0o\n",
    "cidrLimit: 0O17\n",
    "cidrLimit: 0789\n",
    "cidrLimit: 2001-12-14t21:59:43.10-05:00\n",
    "cidrLimit: !!timestamp 2001-12-14\n",
    "cidrLimit: !!binary Mw==\n",
    "cidrLimit: !!float '3'\n",
    "cidrLimit: !!null ''\n",
    "cidrLimit: !<tag:yaml.org,2002:int> '3'\n",
    "cidrLimit: ! 3\n",
    "masqLinkLocal: !!bool 'yes'\n",
    "masqLinkLocal: !!bool 'maybe'\n",
    "a: &a [*a]\n",
    "a: *unknown\n",
    "a: &a 1\nb: &a 2\nc: *a\n",
    "? [a]\n: 1\n",
    "? {a: 1}\n: 1\n",
    "~: 1\n",
    "null: 1\ncidrLimit: 2\n",
    "1.5: x\ncidrLimit: 2\n",
    "18446744073709551615: x\n",
    "1e300: x\n",
    ".inf: x\n",
    "x: .inf\n",
    "x: [.nan]\n",
    "1: a\n\"1\": b\n",
    "true: a\n\"true\": b\n",
    "a: 1\n- b\n",
    "a:\n  b: 1\n c: 2\n",
    "a: b: c\n",
    "a: 'unterminated\n",
    "a: \"unterminated",
    "a: [1, 2\n",
    "a: {b: 1\n",
    "a: @b\n",
    "a: `b\n",
    "a: |0\n  x\n",
    "a: | x\n",
    "a: !e!foo 1\n",
    "a: \"x\" y\n",
    "- 'a' b\n",
    "a: \x01\n",
    "a: b\x7f\n",
    "a: \x00\n",
    "a: \u0080\n",
    "a: \ud7ff\n",
    "a: \ue000\n",
    "a: \ufffe\n",
    "a: \U0001f600\n",
    "cidrLimit: 2\n#\x01 control in comment\n",
    "cidrLimit: 2 #\x01\n",
    "'\x01': 1\n",
    "\"\\x01\": 1\n",
    "nonMasqueradeCIDRs: [\"10.0.0.0/8\\u0000\"]\n",
    "nonMasqueradeCIDRs: [\"\\u00e9\"]\n",
    "nonMasqueradeCIDRs: [\"<>&\\u2028\"]\n",
    "{\"nonMasqueradeCIDRs\": [\"\\ud800\"]}",
    "{\"nonMasqueradeCIDRs\": [\"\\ud83d\\ude00\"]}",
    "{\"nonMasqueradeCIDRs\": [\"\u00e9\"]}",
    "{\"nonMasqueradeCIDRs\": [\"\t\"]}",
    "{\"cidrLimit\": 1, \"cidrLimit\": 2}",
    "{\"cidrLimit\": 1}{}",
    "{\"cidrLimit\": 1}\n---\n",
    "{\"cidrLimit\": 1} # comment",
    "{\"cidrLimit\": 1,}",
    "{\"cidrLimit\": 01}",
    "{\"cidrLimit\": -}",
    "{\"cidrLimit\": 1.}",
    "{\"cidrLimit\": .5}",
    "{\"cidrLimit\": tru}",
    "{\"resyncInterval\": \"\\q\"}",
    "{\"resyncInterval\": \"\\u12G4\"}",
    "{'cidrLimit': 1}",
    "{cidrLimit: 1}",
    "{",
    "{\"a\"",
    "[1, 2]",
    "\"string\"",
    "null",
    "42",
    "true",
    "[]",
    "{}",
    "- 1\n- 2\n",
    "just a string\n",
    "nonMasqueradeCIDRs: [[10.0.0.0/8]]\n",
    "nonMasqueradeCIDRs: [{a: 1}]\n",
    "nonMasqueradeCIDRs: {a: 1}\n",
    "cidrLimit: [1]\n",
    "cidrLimit: {a: 1}\n",
    "masqLinkLocal: [true]\n",
    "resyncInterval: [60s]\n",
    "resyncInterval: 60\ncidrLimit: x\n",
    "cidrLimit: x\nmasqLinkLocal: y\n",
    "masqLinkLocal: y\ncidrLimit: x\n",
    "cidrLimit: x\nresyncInterval: bad\n",
    "resyncInterval: bad\ncidrLimit: x\n",
    "nonMasqueradeCIDRs: [1, 2.5, true]\n",
    "nonMasqueradeCIDRs:\n  -\n  - 1.0.0.0/8\n  -\n  -\n",
    "nonMasqueradeCIDRs: [~, 1.0.0.0/8]\n",
    "nonMasqueradeCIDRs: ~\n",
    "cidrLimit: 0\nnonMasqueradeCIDRs: []\n",
    "cidrLimit: -1\nnonMasqueradeCIDRs: []\n",
    "cidrLimit: 1\nnonMasqueradeCIDRs: [garbage, fc00::/7]\n",
    "nonMasqueradeCIDRs: [fc00::/7, garbage]\n",
    "nonMasqueradeCIDRs: [garbage, fc00::/7]\ncidrLimit: 5\n",
    "nonMasqueradeCIDRs: [\"10.0.0.0/8\", \"10.0.0.0/8\"]\n",
    "nonMasqueradeCIDRs: [10.0.0.0/8, 10.0.0.0/16, 0.0.0.0/0]\n",
    "url: http://example.com:8080/path?q=1#frag\ncidrLimit: 2\n",
    "a: [b: c, d]\ncidrLimit: 2\n",
    "[a: b, c]\n",
    "[? a : b]\n",
    "{? a}\n",
    "a: {? b}\n",
    "a: {b, c: d}\n",
    "a: [b, c: d, {e: f}]\n",
    "a: {b: [c, {d: e}]}\n",
    "a: !!set {b, c}\n",
    "a: !!omap [b: 1, c: 2]\n",
    "a: !!pairs [b: 1, b: 2]\n",
]
for feature in FEATURES:
    emit(feature)
    emit(feature, ipv6=True)

# Deep nesting around go-yaml's limits (10000) and yaml_rust2's (255).
for depth in (254, 255, 256, 257, 1000, 9999, 10000, 10001):
    emit("a: " + "[" * depth + "]" * depth + "\n")
    emit("{\"a\": " + "[" * depth + "]" * depth + "}")
for depth in (100, 9999, 10000, 10001):
    emit("- " * depth + "x\n")
emit("a: " + "{b: " * 300 + "c" + "}" * 300 + "\n")
emit("[" * 10001)
emit("{\"a\":" * 10001)

# Aliases that expand a lot (go-yaml's excessive aliasing check).
bomb = "a: &a [x, x, x, x, x, x, x, x, x, x]\n"
for level in "bcdefgh":
    prev = chr(ord(level) - 1)
    bomb += f"{level}: &{level} [" + ", ".join([f"*{prev}"] * 10) + "]\n"
emit(bomb)
emit("a: &a [x, x]\nb: &b [*a, *a, *a]\nc: [*b, *b]\n")

# ---------------------------------------------------------------------------------------------
# Mutations: random edits of valid documents, for the error paths and their wording.
ALPHABET = list(" :-\t\n\r#'\"[]{},&*!|>?%@`~.019abynNT\\<=_") + [
    "\u00e9", "\u0085", "\ufeff", "\u2028", "\u00a0", "\x00", "\x01", "- ", ": ", "\n  ",
    "\n- ", "---", "...", "? ", "!!", "&a ", "*a", "\t", "<<: "]


def mutate(doc):
    chars = list(doc)
    for _ in range(rng.choice([1, 1, 1, 2, 3])):
        action = rng.random()
        at = rng.randint(0, len(chars))
        if action < 0.4 or not chars:
            chars.insert(at, rng.choice(ALPHABET))
        elif action < 0.7:
            del chars[min(at, len(chars) - 1)]
        else:
            chars[min(at, len(chars) - 1)] = rng.choice(ALPHABET)
    return "".join(chars)


bases = [config_doc() for _ in range(200)] + FEATURES
for _ in range(2200):
    emit(mutate(rng.choice(bases)), ipv6=rng.random() < 0.3)
for _ in range(300):
    emit(mutate(json_doc()))

# Bytes that are not UTF-8, at the start, inside values, keys, comments and JSON strings.
BAD = [b"\xff", b"\xc3", b"\xc3(", b"\xe2\x82", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80",
       b"\x80", b"\xef\xbb", b"\xf4\x90\x80\x80", b"\xc0\xaf"]
for bad in BAD:
    for template in [b"%s", b"cidrLimit: 2\n%s", b"a: %s\n", b"%s: 1\n", b"cidrLimit: 2 # %s\n",
                     b"a: '%s'\n", b"a: \"%s\"\n", b"{\"a\": \"%s\"}", b"{\"a\": %s}",
                     b"nonMasqueradeCIDRs: [\"10.0.0.0/8%s\"]\n", b"{%s}",
                     b"{\"nonMasqueradeCIDRs\": [\"%s\"]}", b"\xef\xbb\xbf%s"]:
        emit(template % bad)

# ---------------------------------------------------------------------------------------------
# masq's own keys (issue 26), which upstream's struct does not have: encoding/json ignores
# them, whatever their value or type, so Go answers as if they were absent. The replay checks
# that masq, with them removed, reads each document as Go does; known-differences.txt lists
# where masq honours them. Emitted last, so the documents before keep their random draws.
# (ipv6, reserved) default to (False, False).
MASQ_KEYS = {
    # A masquerade exception inside the default exempt ranges.
    "masqueradeCIDRs: [10.1.2.0/24]\n": [(False, False), (False, True)],
    "masqueradeCIDRs:\n  - 10.96.0.0/12\n  - 192.168.7.7/32\n": [],
    # With an explicit nonMasqueradeCIDRs list, and the full set of upstream keys beside.
    "nonMasqueradeCIDRs: [10.0.0.0/8, 192.168.0.0/16]\nmasqueradeCIDRs: [10.1.0.0/16, "
    "192.168.5.5/32]\n": [],
    "nonMasqueradeCIDRs:\n  - 10.0.0.0/8\nmasqueradeCIDRs:\n  - 10.96.0.0/12\n"
    "nonMasqueradeSrcCIDRs:\n  - 10.244.0.0/16\ncidrLimit: 5\nmasqLinkLocal: true\n"
    "resyncInterval: 30s\n": [],
    # An exception outside every exempt range (a no-op for masq), one inside a reserved range.
    "masqueradeCIDRs: [8.8.8.0/24]\n": [],
    "masqueradeCIDRs: [100.64.1.0/24]\n": [(False, False), (False, True)],
    # Source exemptions alone.
    "nonMasqueradeSrcCIDRs: [10.244.1.0/24]\n": [],
    "nonMasqueradeSrcCIDRs:\n  - 10.244.1.0/24\n  - 10.244.2.5/32\nnonMasqueradeCIDRs: []\n": [],
    # Both keys, as YAML and as JSON.
    "masqueradeCIDRs: [10.1.2.0/24]\nnonMasqueradeSrcCIDRs: [10.244.0.0/16]\n": [],
    '{"masqueradeCIDRs": ["10.1.2.0/24"], "nonMasqueradeSrcCIDRs": ["10.244.0.0/16"]}': [],
    '{"nonMasqueradeCIDRs": ["10.0.0.0/8"], "masqueradeCIDRs": ["10.96.0.0/12"], '
    '"nonMasqueradeSrcCIDRs": ["10.244.0.0/16"], "cidrLimit": 3}': [],
    # IPv6 entries, with and without --enable-ipv6.
    "masqueradeCIDRs: [fd00:1::/64]\n": [(False, False), (True, False)],
    "nonMasqueradeSrcCIDRs: [fd00:10::/64]\n": [(False, False), (True, False)],
    "nonMasqueradeCIDRs: [10.0.0.0/8, fd00::/8]\nmasqueradeCIDRs: [fd00:1::/32, 10.1.0.0/16]\n"
    "nonMasqueradeSrcCIDRs: [fd00:10::/64]\n": [(False, False), (True, False)],
    "masqueradeCIDRs: [\"::ffff:10.1.0.0/112\"]\n": [(False, False), (True, False)],
    # Empty and null lists.
    "masqueradeCIDRs: []\n": [],
    "masqueradeCIDRs:\n": [],
    "masqueradeCIDRs: null\nnonMasqueradeSrcCIDRs: ~\n": [],
    '{"nonMasqueradeSrcCIDRs": []}': [],
    "masqueradeCIDRs: [~, 10.1.0.0/16]\n": [],
    # Wrong types.
    "masqueradeCIDRs: 5\n": [],
    "masqueradeCIDRs: 10.1.0.0/16\n": [],
    "masqueradeCIDRs: {a: 1}\n": [],
    "masqueradeCIDRs: [10, true]\n": [],
    "nonMasqueradeSrcCIDRs: true\n": [],
    '{"nonMasqueradeSrcCIDRs": "10.244.0.0/16"}': [],
    # A type error in masq's key and one in upstream's: the first in document order wins
    # (YAMLToJSON sorts the keys, JSON keeps them as written).
    "masqueradeCIDRs: 5\ncidrLimit: x\n": [],
    '{"masqueradeCIDRs": 5, "cidrLimit": "x"}': [],
    '{"cidrLimit": "x", "masqueradeCIDRs": 5}': [],
    # Invalid CIDRs inside the new lists.
    "masqueradeCIDRs: [abcdefg]\n": [],
    "masqueradeCIDRs: [10.1.0.1/16]\n": [],
    "masqueradeCIDRs: ['']\n": [],
    "nonMasqueradeSrcCIDRs: [10.244.0.0/33]\n": [],
    "nonMasqueradeSrcCIDRs: [10.244.0.0/16, garbage]\n": [],
    "masqueradeCIDRs: [10.1.0.0/000016]\n": [],
    # An invalid CIDR in upstream's list beside the new ones: both refuse it alike.
    "nonMasqueradeCIDRs: [10.0.0.1/8]\nmasqueradeCIDRs: [garbage]\n": [],
    # The same prefix masqueraded and kept: the defaults', an explicit list's, an alias's.
    "masqueradeCIDRs: [10.0.0.0/8]\n": [],
    "nonMasqueradeCIDRs: [10.0.0.0/8]\nmasqueradeCIDRs: [10.0.0.0/08]\n": [],
    "nonMasqueradeCIDRs: &a [172.16.0.0/12]\nmasqueradeCIDRs: *a\n": [],
    # cidrLimit: upstream counts nonMasqueradeCIDRs only, masq counts all three lists.
    "cidrLimit: 3\nmasqueradeCIDRs: [10.1.0.0/16]\n": [],
    "cidrLimit: 4\nmasqueradeCIDRs: [10.1.0.0/16]\n": [],
    "cidrLimit: 1\nnonMasqueradeCIDRs: [10.0.0.0/8]\nnonMasqueradeSrcCIDRs: [10.244.0.0/16]\n": [],
    "cidrLimit: 1\nnonMasqueradeCIDRs: [10.0.0.0/8, 1.0.0.0/8]\nmasqueradeCIDRs: [10.1.0.0/16]\n": [],
    # Spellings encoding/json's case-insensitive match maps to masq's keys (ſ folds to s),
    # repeated keys, and near misses that match nothing.
    "MasqueradeCidrs: [10.1.0.0/16]\n": [],
    "MASQUERADECIDRS: [10.1.0.0/16]\n": [],
    "masqueradecidrs: [10.1.0.0/16]\n": [],
    "NonMasqueradeSrcCidrs: [10.244.0.0/16]\n": [],
    "nonmasqueradesrccidrs: [10.244.0.0/16]\n": [],
    "masqueradeCIDRſ: [10.1.0.0/16]\n": [],
    '{"masqueradeCIDRs": ["10.1.0.0/16"], "MASQUERADECIDRS": ["10.2.0.0/16"]}': [],
    '{"MASQUERADECIDRS": ["10.2.0.0/16"], "masqueradeCIDRs": ["10.1.0.0/16"]}': [],
    "masqueradeCIDR: [10.1.0.0/16]\n": [],
    "masquerade_cidrs: [10.1.0.0/16]\n": [],
    "nonMasqueradeSrcCIDR: [garbage]\n": [],
}
for doc, flags in MASQ_KEYS.items():
    for ipv6, reserved in flags or [(False, False)]:
        emit(doc, ipv6=ipv6, reserved=reserved)



def routines():
    """Inputs for single Go functions (routines.jsonl): what go-compat reproduces below the
    level of a whole config file, each answered by the real function in main.go."""
    r = random.Random(20261123)
    records = []

    def ask(routine, inputs, arg=0):
        for text in inputs:
            record = {"routine": routine, "arg": arg}
            if isinstance(text, bytes):
                record["b64"] = base64.b64encode(text).decode("ascii")
            else:
                record["input"] = text
            records.append(record)

    # strconv.Quote (%q in upstream's messages): every Latin-1 character, then a sample of
    # the printable and unprintable beyond it.
    ask("strconv.Quote", ["", "10.0.0.1/8", 'a"b\\c', "tab\there\n", "\x01\x7f", "caf\u00e9",
                          "nbsp\u00a0zw\u200b"] + [chr(c) for c in range(256)] + [
        "\u0300", "\u034f", "\u061c", "\u1680", "\u180e", "\u2028", "\u2060", "\u3000",
        "\u4e2d", "\ufeff", "\ue000", "\ufffd", "\U0001f600", "\U000e0001", "\U0010ffff"])
    ints = ["0", "42", "+42", "-7", "007", "", "+", "-", "4x", " 1", "1 ", "+-1", "1_000", "_1",
            "1__0", "0x1F", "0X10", "-0b101", "0B11", "0o17", "0O17", "017", "08", "0x", "0b",
            "0x_1F", "0_17", "1e3", "\u0663", "9223372036854775807", "9223372036854775808",
            "-9223372036854775808", "-9223372036854775809", "18446744073709551615",
            "18446744073709551616", "99999999999999999999", "-0x8000000000000000",
            "0xFFFFFFFFFFFFFFFF", "1" * 64, "1" * 65, "-" + "1" * 63, "101", "-101", "2"]
    ask("strconv.Atoi", ints)
    for base in (0, 2):
        ask("strconv.ParseInt", ints + INTS, base)
        ask("strconv.ParseUint", ints + INTS, base)
    # ParseFloat as go-compat uses it: the decimal forms go-yaml hands it.
    ask("strconv.ParseFloat", [
        "0", "-0", "0.1", "1.5", ".5", "+.5", "1.", "1.e5", "-1.5e+3", "6.4e1", "1E3", "+1", "1e",
        "1e+", "e5", ".", "-", ".5_0", "._5", "1_000.5", "1__0.5", "1_.5", "1._5", "1e1_0",
        "1e400", "1e-400", "5e-324", "2e-324", "3e-324", "1e-320", "1.7976931348623157e308",
        "1.7976931348623159e308", "123456789012345678901234567890", "0.000001"])
    floats = ["0", "-0", "0.1", "1.5", "64", "100000", "1e6", "0.0001", "0.00001", "123456789",
              "1.234567891234", "1e20", "1e21", "1e-6", "1e-7", "1.5e-7", "0.000001234",
              "123456789012345678", "-2.5e-10", "5e-324", "1.7976931348623157e308",
              "3.4028234663852886e38", "1e-45", "16777217", "999999.5", "1e300"]
    floats += [f"{r.uniform(1, 10):.{r.randint(0, 16)}f}e{r.randint(-330, 308)}"
               for _ in range(60)]
    ask("json.Marshal(float64)", floats)
    for bits in (32, 64):
        ask("strconv.FormatFloat", floats + ["NaN", "-Inf", "+Inf"], bits)
    ask("time.ParseDuration", DURATIONS + [
        "1h30m", "2\u03bcs", "-", ".s", "1", "1.5", "1..5s", "1s.", "1s1", "\u00b5s", "+0", "-0",
        "0.0", "00s", "1h-1m", "5m0.5s", "0.1234567890123456789h", "1.00000000000000000000001s",
        "-9223372036854775808ns", "-9223372036854775809ns", "100000000000000000000ns",
        "2562047h47m16.854775807s", "2562047h47m16.854775808s", "-2562047h47m16.854775808s"])
    nanos = [0, 1, -1, 999, 1000, 1100, 2200000, 10**9, 1500 * 10**6, 60 * 10**9, 300 * 10**9,
             5400 * 10**9, 3602 * 10**9 + 1, -5 * 10**9, 59999999999, -(2**63), 2**63 - 1]
    nanos += [r.randint(-10**r.randint(1, 18), 10**r.randint(1, 18)) for _ in range(60)]
    ask("time.Duration.String", [str(n) for n in nanos])
    ask("net.ParseCIDR", CIDRS + [
        "10.0.0.0/32", "1.2.3.4/0", "1.2.3.04/32", "1.2.3.4.5/32",
        "::ffff:10.0.0.1/104", "::ffff:10.0.0.0/96", "::ffff:10.0.0.0/95", "::ffff:1.2.3.4/128",
        "::/128", "0::0/0", "::1/0128", "1:2:3:4:5:6:7:8/64", "1:2:3:4:5:6:7:8:9/64",
        "[::1]/128", "169.254.0.0/16", "fe80::/10", "fc00::/7", "10.0.0.0/000000008",
        "10.0.0.0/" + "0" * 40 + "32", "::/" + "0" * 30 + "128", "10.0.0.0/000000033",
        "10.0.0.0/16777215", "10.0.0.0/16777216", "10.0.0.0/99999999999999999999",
        "10.0.0.0/00000000000x"])
    # encoding/json's reader: every byte alone and inside a string, the grammar's corners,
    # nesting at Go's limit, random strings.
    documents = [bytes([b]) for b in range(256)] + [b'"%c"' % b for b in range(0x21)] + [
        "null", "true", "false", '"x"', "0", " \t\r\n42 \n", "64", "64.0", "-0", "1e+21", "1E5",
        "0.5e-3", "12345678901234567890123", "-1.25", '{"n":1e+21}',
        '{"b": 1, "a": [true, null, {}], "b": "again", "": []}',
        '[[1,[2,[3]]],{"a":{"b":{"c":[]}}}]',
        '{"nonMasqueradeCIDRs": ["10.0.0.0/8"], "cidrLimit": 64, "resyncInterval": "60s"}',
        '"a\\"b\\\\c\\/d\\be\\ff\\ng\\rh\\ti"', '"\\u0041\\u00e9\\u4e2D"', '"h\u00e9llo \u2603 \U0001f600"',
        '"<>&\u2028\u2029\x7f"', '"\\ud83d\\ude00"', '"\\ud83d"', '"\\ude00x"', '"\\ud83d\\u0041"',
        '"\\ud83d\\ud83d\\ude00"', '"\\ud83dA"', b'"a\xe2\x82b"', b'"\xff"',
        "", "   ", "\n", "[2, 3", '"abc', "[", '"\\', '"\\u12', "[1, 2, 3+]", "[1,]", "x", ":",
        "tx", "trx", "tru", "fals", "fx", "nul", "nx", "True", "truex", "-a", "1.", "1.e5", "1e",
        "1e+", "1ex", "01", "+1", ".5", "1.5.2", '"a\tb"', '"a\nb"', '"\\q"', '"\\\'"',
        '"\\U0041"', '"\\u12G4"', '"\\u"', "1 2", "[]\n\n]", "null,", '[x, "\\q"]',
        '[1, "\\q", x]', "\u00e9", "\ufeff{}", "[1\u0085]", "[\x1b]", " {}\r\n\t ",
        "[" * 10000 + "]" * 10000, "[" * 10001, '{"a":' * 10000 + "{", "[" * 20000]
    alphabet = '{}[]",:\\ntrufalse0123456789.eE+-u \t\r\nxq\x01'
    documents += ["".join(r.choice(alphabet) for _ in range(r.randint(0, 23)))
                  for _ in range(2000)]
    ask("json.Unmarshal", documents)
    for record in records:
        sys.stdout.write(json.dumps(record) + "\n")


if sys.argv[1:] != ["corpus"]:
    if sys.argv[1:] != ["routines"]:
        sys.exit("usage: gen.py corpus|routines")
    routines()
    sys.exit(0)

for doc, ipv6, reserved in out:
    sys.stdout.write(json.dumps({"doc": base64.b64encode(doc).decode("ascii"), "ipv6": ipv6,
                                 "reserved": reserved}) + "\n")
