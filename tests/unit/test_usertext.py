"""Strings from users: checked at the API boundary (core.usertext), printed as one safe line (cli.common.shown)."""
import pytest

from hai_cluster.cli.common import shown
from hai_cluster.core.usertext import TextError, checked, printable


def test_checked_refuses_nul_control_characters_and_length():
    assert checked("x", "fine name", max_len=20) == "fine name"
    with pytest.raises(TextError, match="x contains a NUL character"):
        checked("x", "a\0b", max_len=20, line=False)
    with pytest.raises(TextError, match=r"contains control characters \(a\\x1b\[2J\)"):
        checked("x", "a\x1b[2J", max_len=20)
    assert checked("x", "two\nlines", max_len=20, line=False) == "two\nlines"  # an argument may
    with pytest.raises(TextError, match="too long"):
        checked("x", "y" * 21, max_len=20)


def test_replies_are_printed_as_one_line_of_visible_text():
    forged = {"jobs": [{"name": "x\n999 gpu FAKE root R", "reason": "\x1b]0;title\x07", "id": 3,
                        "rtl": "abc\u202edef", "ok": "naïve ✓"}]}
    out = shown(forged)["jobs"][0]
    assert out["name"] == "x\\n999 gpu FAKE root R" and out["reason"] == "\\x1b]0;title\\x07"
    assert out["rtl"] == "abc\\u202edef" and out["ok"] == "naïve ✓" and out["id"] == 3
    assert all(v.isprintable() for v in out.values() if isinstance(v, str))
    assert printable("plain") == "plain"


def test_a_name_in_a_terminal_table_is_never_rich_markup(monkeypatch):
    """A job named "[/x]" crashed another user's hqueue on a terminal (rich's MarkupError), and
    "[link=...]" or "[conceal]" would have made links or hidden text."""
    import io
    import sys

    from hai_cluster.cli.common import print_table

    class Tty(io.StringIO):
        def isatty(self):
            return True
    out = Tty()
    monkeypatch.setattr(sys, "stdout", out)
    print_table(["JOBID", "NAME"], [["1", "[/x]"], ["2", "[link=http://evil]click[/link]"], ["3", "[conceal]hid"]])
    text = out.getvalue()
    assert "[/x]" in text and "[link=http://evil]click[/link]" in text and "[conceal]hid" in text
    assert "\x1b]8;" not in text  # no OSC-8 hyperlink


def test_a_table_wider_than_the_terminal_is_printed_whole_not_cut(monkeypatch):
    """rich cut ids and times at 80 columns ("1234_[3-..."): no value is ever shown cut."""
    import io
    import sys

    from hai_cluster.cli import common
    from hai_cluster.cli.common import print_table

    class Tty(io.StringIO):
        def isatty(self):
            return True
    out = Tty()
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(common, "terminal_columns", lambda: 80)
    long_id, name = "1234_[3-999%10]", "x" * 70
    print_table(["JOBID", "NAME", "TIME"], [[long_id, name, "10-00:00:00"]])
    text = out.getvalue()
    assert long_id in text and name in text and "10-00:00:00" in text, text
