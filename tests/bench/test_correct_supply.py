from bench.tools.correct_supply import main, supply
from tba.algorithm.store import BufferStore
from tba.algorithm.types import Group, Sample


def group(prompt_id, version, rewards, source="policy"):
    return Group(prompt_id, [1, 2], [Sample([3, 4], [-1.0, -1.0], r, version) for r in rewards], source=source)


def test_counts_groups_with_a_correct_sample_per_window_of_versions(tmp_path, capsys):
    store = BufferStore(tmp_path)
    store.append([group(0, 0, [0.0, 1.0]), group(1, 3, [0.0, 0.0]), group(2, 4, [1.0, 1.0], source="gold")], step=5)
    store.append([group(0, 5, [1.0, 0.5]), group(1, 9, [0.5, 0.5])], step=9)
    store.close()
    got = supply(tmp_path / "buffer.sqlite", every=5, correct=1.0)
    assert got == {0: (2, 0.5, 0.25), 5: (2, 0.5, 0.625)}  # the "gold" group is not the searchers' supply
    main([str(tmp_path), "--every", "5", "--windows", "3"])
    row = capsys.readouterr().out.splitlines()[-1]
    assert row.endswith("| 50% of 2 (0.250) | 50% of 2 (0.625) | — |")
