#!/bin/sh
# Checks deploy/grafana/sluice.json (parses, tenant variable, known metrics).
set -e
cd "$(dirname "$0")/.."
python3 -c 'import json,sys; d=json.load(open("deploy/grafana/sluice.json")); assert any(v["name"]=="tenant" for v in d["templating"]["list"]); print("dashboard JSON ok:", len(d["panels"]), "panels")'
cargo test -q -p sluice-admin --test dashboard
