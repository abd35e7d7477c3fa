"""Small tails are staged: dispatch writes the new units of every queue whose tail is small as
staged entries, a flush writes them as ONE staged row of units.db and keeps the tails in
memory; a load replays the staged rows into the tails. What a load answers must be what the
queues answered before, whatever mix of staged rows, runs, compactions and cuts produced it."""
import sqlite3

import pytest

from tidemq.node.store import unit_db
from tidemq.node.store.queue_table import ConsumeQueueTable

QUEUES = 2000


def _table(path) -> ConsumeQueueTable:
    table = ConsumeQueueTable(None, str(path))
    table.load()
    return table


def _reopened(table, path) -> ConsumeQueueTable:
    """The table as a killed process leaves it: nothing uncommitted survives."""
    table.abandon()
    again = ConsumeQueueTable(None, str(path))
    assert again.load()
    return again


def _reloaded_alike(table, path) -> ConsumeQueueTable:
    """Kill and load again; the loaded table must answer as `table` did."""
    before = _answers(table)
    table = _reopened(table, path)
    assert _answers(table) == before
    return table


def _answers(table) -> dict:
    return {key: (cq.min_queue_offset, cq.max_queue_offset, cq.max_phys_end,
                  cq.units(cq.min_queue_offset, 10_000))
            for key, cq in sorted(table.queues.items())}


def _spread(table, rounds: int, phys: int = 1) -> int:
    """`rounds` units in each of QUEUES queues (one per queue per round), a flush per round."""
    for _ in range(rounds):
        for q in range(QUEUES):
            cq = table.get_or_create(f"T{q // 8}", q % 8)
            cq.put(cq.max_queue_offset, phys, 10, q)
            phys += 10
        table.flush()
    return phys


def _count(table, sql: str) -> int:
    return table.db._conn.execute(sql).fetchone()[0]


def test_a_flush_over_many_small_tails_writes_one_row_and_a_load_replays_it(tmp_path):
    table = _table(tmp_path)
    _spread(table, 1)
    before_rows, before = table.db.rows_written, _answers(table)
    _spread(table, 1, phys=10**6)
    assert table.db.rows_written - before_rows == 1  # one staged row, not one per queue
    assert _count(table, "SELECT count(*) FROM units") == 0
    assert _count(table, "SELECT count(*) FROM staged") == 2
    assert before != _answers(table)
    table = _reloaded_alike(table, tmp_path)
    assert table.tails.staged_bytes > 0 and not table.tails.big and not table.tails.pending
    table.close()


def test_a_tail_that_grows_becomes_runs_and_its_staged_entries_are_skipped(tmp_path):
    """Entries staged before a queue's tail became runs stay in the staged rows until the next
    compaction; a load skips what the runs already hold."""
    table = _table(tmp_path)
    busy, idle = table.get_or_create("Busy", 0), table.get_or_create("Idle", 0)
    phys = 1
    for _ in range(3 * unit_db.STAGE_UNITS):
        busy.put(busy.max_queue_offset, phys, 10, 1)
        phys += 10
        if busy.max_queue_offset % 5 == 0:
            idle.put(idle.max_queue_offset, phys, 10, 2)
            phys += 10
            table.flush()
    table.flush()
    assert _count(table, "SELECT count(*) FROM units") >= 2  # busy's tail became runs
    assert idle.tail and not table.tails.big and not table.tails.pending  # idle's: staged
    _reloaded_alike(table, tmp_path).close()


def test_staging_past_its_bound_compacts_into_runs(tmp_path, monkeypatch):
    monkeypatch.setattr(unit_db, "STAGE_BYTES", 50_000)
    monkeypatch.setattr(unit_db, "COMPACT_STEPS", 1)
    table = _table(tmp_path)
    _spread(table, 3)
    assert table.tails.staged_bytes > 50_000
    before = _answers(table)
    _spread(table, 1, phys=10**7)  # this flush compacts: every tail becomes runs
    # only this flush's own staged row is left (its units are in the runs too)
    assert _count(table, "SELECT count(*) FROM staged") == 1
    assert table.tails.staged_bytes == _count(table, "SELECT length(entries) FROM staged")
    assert table.tails.nbytes == 0 and table.tails.to_compact is None
    assert _count(table, "SELECT count(*) FROM units") == QUEUES
    after = _answers(table)
    assert all(after[k][3][:3] == before[k][3] for k in before)
    _reloaded_alike(table, tmp_path).close()


def test_a_cut_compacts_first_so_a_load_never_brings_cut_units_back(tmp_path):
    table = _table(tmp_path)
    _spread(table, 3)
    cut = table.get("T3", 5)
    cut.truncate_to(1)
    assert _count(table, "SELECT count(*) FROM staged") == 0  # compacted before the cut
    _spread(table, 1, phys=10**7)  # staged again, after the cut
    assert cut.max_queue_offset == 2 and _count(table, "SELECT count(*) FROM staged") == 1
    table = _reloaded_alike(table, tmp_path)
    assert table.get("T3", 5).max_queue_offset == 2
    table.remove_topic("T2")  # a dropped queue's key may be reused: nothing staged names it
    assert _count(table, "SELECT count(*) FROM staged") == 0
    table.close()


def test_a_failed_staging_flush_keeps_the_pending_entries_and_the_next_one_writes_them(tmp_path):
    """The database may not grow (SQLITE_FULL): the flush fails whole, every tail keeps its
    unstaged units, and once it may grow the next flush stages them; nothing is lost."""
    table = _table(tmp_path)
    _spread(table, 1)
    conn = table.db._conn
    pages = conn.execute("PRAGMA page_count").fetchone()[0]
    conn.execute(f"PRAGMA max_page_count={pages}")
    phys = 10**6
    for q in range(QUEUES):
        cq = table.get_or_create(f"T{q // 8}", q % 8)
        cq.put(cq.max_queue_offset, phys + q * 10, 10, q)
    pending = bytes(table.tails.pending)
    assert len(pending) == QUEUES * (unit_db.STAGE_HEAD.size + unit_db.UNIT_BYTES)
    with pytest.raises(sqlite3.OperationalError, match="full"):
        table.flush()
    assert table.tails.pending == pending  # kept whole for the next flush
    conn.execute("PRAGMA max_page_count=1073741823")
    assert table.flush()
    assert all(len(a[3]) == 2 for a in _answers(table).values())
    _reloaded_alike(table, tmp_path).close()


def test_a_staged_entry_that_leaves_a_gap_has_the_database_rebuilt(tmp_path):
    table = _table(tmp_path)
    _spread(table, 2)
    table.close()
    db = sqlite3.connect(tmp_path / "consumequeue" / unit_db.DB_NAME)
    qkey = db.execute("SELECT qkey FROM queues WHERE topic = 'T1' AND qid = 2").fetchone()[0]
    bogus = unit_db.STAGE_HEAD.pack(qkey, 7, 1) + unit_db.UNIT.pack(99, 10, 0)  # next is 2
    db.execute("INSERT INTO staged(entries) VALUES (?)", (bogus,))
    db.commit()
    db.close()
    table = ConsumeQueueTable(None, str(tmp_path))
    assert not table.load()  # recovery rebuilds from the commit log
    assert not table.queues
    assert _count(table, "SELECT count(*) FROM queues") == 0
    table.close()


def test_a_format_2_database_is_discarded(tmp_path):
    """Format 2 had no staged rows: it is removed and rebuilt from the log."""
    (tmp_path / "consumequeue").mkdir()
    old = sqlite3.connect(tmp_path / "consumequeue" / unit_db.DB_NAME)
    for stmt in unit_db._SCHEMA[:2]:
        old.execute(stmt)
    old.execute("INSERT INTO queues VALUES (1, 'T', 0)")
    old.execute("PRAGMA user_version=2")
    old.commit()
    old.close()
    table = ConsumeQueueTable(None, str(tmp_path))
    assert not table.load()
    assert table.db.discarded and not table.queues
    table.close()


def _loaded(path) -> dict:
    """What a load of the committed database answers (another connection, as after a kill)."""
    again = ConsumeQueueTable(None, str(path))
    assert again.load()
    answers = _answers(again)
    again.abandon()
    return answers


def test_a_long_staged_backlog_is_compacted_over_several_flushes(tmp_path, monkeypatch):
    """Past STAGE_BYTES the tails become runs a share per flush and only the last step
    deletes the staged rows; a kill at any step loads what a whole compaction would have."""
    monkeypatch.setattr(unit_db, "STAGE_BYTES", 200_000)
    monkeypatch.setattr(unit_db, "COMPACT_STEPS", 4)
    table, whole = _table(tmp_path / "steps"), _table(tmp_path / "whole")
    _spread(table, 3)
    _spread(whole, 3)
    assert table.tails.to_compact is None and table.tails.staged_bytes > 200_000
    staged_rows = _count(table, "SELECT count(*) FROM staged")
    units_rows = []
    for step in range(4):
        phys = 10**7 * (step + 1)
        _spread(table, 1, phys=phys)
        _spread(whole, 1, phys=phys)
        whole.compact()
        units_rows.append(_count(table, "SELECT count(*) FROM units"))
        if step < 3:  # the older staged rows stay until the last step
            assert table.tails.to_compact is not None
            assert _count(table, "SELECT count(*) FROM staged") == staged_rows + step + 1
        assert _answers(table) == _answers(whole)
        assert _loaded(tmp_path / "steps") == _answers(whole)  # a kill at this step
    assert units_rows == [QUEUES // 4, QUEUES // 2, 3 * QUEUES // 4, QUEUES]
    assert table.tails.to_compact is None
    # the rows older than the compaction are gone; each step's own entries stay
    assert _count(table, "SELECT count(*) FROM staged") == 4
    assert table.tails.staged_bytes == _count(table, "SELECT sum(length(entries)) FROM staged")
    _reloaded_alike(table, tmp_path / "steps").close()
    whole.close()


def test_a_failed_compaction_step_is_taken_again_by_the_next_flush(tmp_path, monkeypatch):
    monkeypatch.setattr(unit_db, "STAGE_BYTES", 200_000)
    monkeypatch.setattr(unit_db, "COMPACT_STEPS", 2)
    table = _table(tmp_path)
    _spread(table, 3)
    conn = table.db._conn
    conn.execute(f"PRAGMA max_page_count={conn.execute('PRAGMA page_count').fetchone()[0]}")
    with pytest.raises(sqlite3.OperationalError, match="full"):
        _spread(table, 1, phys=10**7)
    assert len(table.tails.to_compact) == QUEUES  # nothing taken: the step comes again
    assert _count(table, "SELECT count(*) FROM units") == 0
    conn.execute("PRAGMA max_page_count=1073741823")
    assert table.flush()
    assert len(table.tails.to_compact) == QUEUES // 2
    assert _count(table, "SELECT count(*) FROM units") == QUEUES // 2
    _spread(table, 1, phys=10**8)
    assert table.tails.to_compact is None
    _reloaded_alike(table, tmp_path).close()
