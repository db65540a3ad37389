"""Write docs/lab-report-example.html: the fleet page `egpu-setup report --html` draws for the
recorded lab (tests/data/reports/lab: six laptops as the Ansible role fetched them) plus this
project's own recorded reports (tests/data/reports/real: a CPU-only verify and an image root's
install), so the example shows every state a lab sees, from reports, never by hand.

    python scripts/make_lab_example.py             # writes docs/lab-report-example.html
    python scripts/make_lab_example.py --check     # exit 1 when it is out of date

The page is built by the functions `egpu-setup report --html` calls (fleet.rows.collect, then
fleet.html.render_html), with the ages measured at a fixed time so the file is the same on every
run. A test runs --check, so a change to the page's code fails CI until it is regenerated.
"""

from __future__ import annotations

import logging
import os
import sys
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PAGE = REPO / "docs" / "lab-report-example.html"
# the folders as an admin would name them, relative to the checkout: the page shows them
SOURCES = ("tests/data/reports/lab", "tests/data/reports/real")
# a few days after the recorded lab's run: the ages read as a lab's would
NOW = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)
TITLE = "Lab 3.12 (recorded reports)"


def render() -> str:
    sys.path.insert(0, str(REPO))
    from egpu_setup.fleet.html import render_html
    from egpu_setup.fleet.rows import collect

    os.chdir(REPO)
    # lab-06's ansible-facts.json is skipped on purpose (the page lists it); no log line for it
    logging.getLogger("egpu_setup.report").setLevel(logging.ERROR)
    return render_html(collect(SOURCES, now=NOW), title=TITLE)


def main() -> int:
    page = render()
    if "--check" in sys.argv[1:]:
        if not PAGE.is_file() or PAGE.read_text(encoding="utf-8") != page:
            print(
                f"{PAGE.relative_to(REPO)} is out of date: run python scripts/make_lab_example.py",
                file=sys.stderr,
            )
            return 1
        return 0
    PAGE.write_text(page, encoding="utf-8")
    print(f"wrote {PAGE.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
