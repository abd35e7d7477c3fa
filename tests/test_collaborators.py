"""Components get their collaborators, not the whole Broker: checked on every server module's
source.

node/broker.py is the composition root: it builds each component and hands it the store, the
tables and the services it uses. Outside it (and node/main.py, which runs it), no module
imports the Broker, keeps a `broker` attribute, or takes a `broker` parameter, so what a
component depends on stays visible in its constructor. The allow-list below names the few
places that still take the whole broker and why; shrink it, never grow it.
"""
from __future__ import annotations

import ast

import pytest

from tests.test_import_rules import modules

ROOT = "tidemq.node.broker"
RUNNERS = {"tidemq.node.main", "tidemq.node.__main__"}
# module -> why it still takes the whole broker
ALLOWED = {
    "tidemq.node.processors": "register_all is the broker's wiring step: it reads the broker's "
                              "components to build each processor",
}
SERVER_AREAS = ("tidemq.node", "tidemq.ha", "tidemq.coordinator")


def _names_broker(annotation) -> bool:
    """An unannotated parameter, or one annotated with Broker (text or name)."""
    if annotation is None:
        return True
    return "Broker" in {getattr(n, "id", None) or getattr(n, "value", None)
                        for n in ast.walk(annotation)} - {None}


def broker_uses(path: str) -> list[str]:
    """Where a module imports the Broker, stores a broker, or takes one as a parameter."""
    tree = ast.parse(open(path, encoding="utf-8").read())
    found = []
    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.ImportFrom) and node.module == ROOT:
            found.append(f"{line}: imports {ROOT}")
        elif isinstance(node, ast.Import) and any(a.name == ROOT for a in node.names):
            found.append(f"{line}: imports {ROOT}")
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:   # self.broker = ... (a message's .broker field is no broker)
                if (isinstance(t, ast.Attribute) and t.attr == "broker"
                        and isinstance(t.value, ast.Name) and t.value.id == "self"):
                    found.append(f"{line}: stores self.broker")
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            a = node.args
            for arg in [*a.posonlyargs, *a.args, *a.kwonlyargs]:
                if arg.arg == "broker" and _names_broker(arg.annotation):
                    found.append(f"{line}: takes a `broker` parameter")
    return found


def server_modules() -> dict[str, str]:
    return {m: p for m, p in modules().items()
            if m.startswith(SERVER_AREAS) and m != ROOT and m not in RUNNERS}


@pytest.mark.parametrize("module", sorted(m for m in server_modules() if m not in ALLOWED))
def test_no_component_holds_the_broker(module):
    uses = broker_uses(server_modules()[module])
    assert not uses, (f"{module} reaches for the whole Broker; pass it the collaborators it "
                      f"uses instead: {uses}")


def test_the_allow_list_is_current():
    """Every allowed module exists and still needs its entry (an entry that is no longer
    needed is removed, so the list only shrinks)."""
    found = server_modules()
    assert set(ALLOWED) <= set(found), set(ALLOWED) - set(found)
    stale = [m for m in ALLOWED if not broker_uses(found[m])]
    assert not stale, stale


def test_the_check_sees_a_stored_broker(tmp_path):
    """The checker itself: each of the three forms is reported; a BrokerData parameter and a
    message's `broker` field are not."""
    src = tmp_path / "m.py"
    src.write_text("from tidemq.node.broker import Broker\n"
                   "class A:\n"
                   "    def __init__(self, broker):\n"
                   "        self.broker = broker\n"
                   "def route(tc, broker: BrokerData):\n"
                   "    mq.broker = broker\n")
    uses = sorted(broker_uses(str(src)))
    assert uses == ["1: imports tidemq.node.broker", "3: takes a `broker` parameter",
                    "4: stores self.broker"], uses
