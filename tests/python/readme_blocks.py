"""The README's command blocks that tests run as written.

A block a test runs is marked in README.md by a comment on the line before
its fence, `<!-- tested: NAME (...) -->`, so that editing the block changes
what the test runs, and removing the marker fails the test rather than
silently testing nothing.
"""

import os
import re

README = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                       "..", "..", "README.md"))


def readme_block(name):
    """The text of the ```sh block marked `<!-- tested: name ... -->`."""
    with open(README) as f:
        text = f.read()
    found = re.findall(r"^<!-- tested: " + re.escape(name) + r"\b[^\n]*-->\n```sh\n(.*?)^```",
                       text, re.S | re.M)
    if len(found) != 1:
        raise AssertionError(f"README.md has {len(found)} ```sh blocks marked "
                             f"<!-- tested: {name} -->, not one")
    return found[0]
