"""Parses a /metrics body (stdin) with prometheus_client's parsers and prints its samples.

Both the OpenMetrics parser (strict: it rejects a body without '# EOF', bad types, bad
histograms) and the classic Prometheus text parser must accept the body. Output: JSON list of
[family, type, sample name, labels, value] from the OpenMetrics parse.
"""
import json
import sys

from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics
from prometheus_client.parser import text_string_to_metric_families as prometheus

body = sys.stdin.read()
samples = []
for family in openmetrics(body):
    for s in family.samples:
        samples.append([family.name, family.type, s.name, s.labels, s.value])
classic = sum(len(f.samples) for f in prometheus(body))
if classic != len(samples):
    sys.exit(f"the Prometheus text parser saw {classic} samples, OpenMetrics {len(samples)}")
print(json.dumps(samples))
