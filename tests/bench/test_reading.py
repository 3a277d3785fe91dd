"""bench/lib/reading.py: a benchmark that rewrites its results table keeps the hand-written reading below it."""

def test_a_rewrite_keeps_the_reading_and_replaces_the_table(tmp_path, bench_script):
    write_keeping_reading = bench_script("bench.lib.reading").write_keeping_reading
    path = tmp_path / "r.md"
    write_keeping_reading(path, "# t\n\n| a |\n")
    assert path.read_text() == "# t\n\n| a |\n"
    path.write_text(path.read_text() + "\n## Reading (by hand)\n\n- it means this\n")
    write_keeping_reading(path, "# t\n\n| b |")
    assert path.read_text() == "# t\n\n| b |\n\n## Reading (by hand)\n\n- it means this\n"
