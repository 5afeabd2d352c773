"""Reads `cargo metadata` on stdin; fails when a locked normal or build
dependency of a workspace crate declares a rust-version above the
workspace's own."""
import json
import sys


def version(text):
    parts = [int(x) for x in text.split(".")[:3]]
    return tuple(parts + [0] * (3 - len(parts)))


def shown(v):
    return ".".join(map(str, v))


meta = json.load(sys.stdin)
packages = {p["id"]: p for p in meta["packages"]}
nodes = {n["id"]: n for n in meta["resolve"]["nodes"]}
members = set(meta["workspace_members"])
msrv = max(version(packages[m]["rust_version"]) for m in members)
seen, stack = set(), list(members)
while stack:
    node = stack.pop()
    if node in seen:
        continue
    seen.add(node)
    for dep in nodes[node]["deps"]:
        if any(k["kind"] in (None, "build") for k in dep["dep_kinds"]):
            stack.append(dep["pkg"])
too_new = sorted(
    (packages[p]["name"], packages[p]["version"], packages[p]["rust_version"])
    for p in seen - members
    if packages[p].get("rust_version") and version(packages[p]["rust_version"]) > msrv
)
for name, ver, needs in too_new:
    print(f"{name} {ver} needs Rust {needs}, above the declared {shown(msrv)}")
if too_new:
    sys.exit(1)
print(f"MSRV {shown(msrv)}: all {len(seen - members)} locked dependencies fit")
