"""bench/peers/notes.md explains every target the peers report can miss.

The generated section of docs/BENCHMARKS.md copies a target's explanation
from notes.md when ckptd misses it; a missing or truncated section turns
into "no explanation recorded yet" in the docs (it happened twice, each
time from an edit that cut the file short). So: every id report.py's
targets() can give has a non-empty explanation, `general` and `capped`
exist, every section heading names a target or one of those, and the
results file the docs were made from gives only known ids.
"""
import glob
import json
import os
import sys
import unittest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(REPO, "bench", "peers"))
import report  # noqa: E402

# Section names that are not target ids.
EXTRA_SECTIONS = {"general", "capped", "blocking-vs-dcp"}


class PeersNotesTest(unittest.TestCase):
    def setUp(self):
        self.notes = report.load_notes()

    def test_every_target_has_an_explanation(self):
        for tid in report.TARGET_IDS:
            with self.subTest(target=tid):
                self.assertTrue(report.note_for(self.notes, tid),
                                f"bench/peers/notes.md has no section for {tid}")

    def test_general_and_capped_sections_exist(self):
        for name in ("general", "capped"):
            with self.subTest(section=name):
                self.assertTrue(self.notes.get(name))

    def test_every_section_is_known(self):
        unknown = set(self.notes) - set(report.TARGET_IDS) - EXTRA_SECTIONS
        self.assertEqual(unknown, set(), "sections that no target uses")

    def test_results_give_only_known_targets(self):
        files = glob.glob(os.path.join(REPO, "bench", "peers", "results", "peers-*.json"))
        self.assertTrue(files)
        for path in files:
            with self.subTest(results=os.path.basename(path)):
                with open(path) as f:
                    results = json.load(f)
                report.annotate(results)
                ids = {t["id"] for st in results["states"] for t in st["targets"]}
                self.assertTrue(ids)
                self.assertLessEqual(ids, set(report.TARGET_IDS))


if __name__ == "__main__":
    unittest.main()
