"""Where the shipped Prometheus alert rules and Grafana dashboard lie in the checkout."""

from tests.conftest import REPO

RULES_DIR = REPO / "deploy" / "prometheus"
DASHBOARD = REPO / "deploy" / "grafana" / "rayscope.json"
