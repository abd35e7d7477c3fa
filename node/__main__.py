"""`python -m tidemq.node [-c broker.toml] [--set key=value ...]`: run a broker."""
import sys

from tidemq.node.main import run_broker

sys.exit(run_broker(sys.argv[1:]))
