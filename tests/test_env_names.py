"""The renamed environment variables: an old name still tunes what the new one does for a release, with a warning."""

from specview.core.env_names import adopt_old_names


def test_an_old_name_is_copied_to_the_new_one_with_one_warning():
    environ, lines = {"SPECVIEW_FASTLINEAR": "thin"}, []
    adopt_old_names(environ, lines.append)
    assert environ["SPECVIEW_PACKED_LINEAR"] == "thin"
    assert lines == ["specview: SPECVIEW_FASTLINEAR is now SPECVIEW_PACKED_LINEAR; the old name works until the next "
                     "release"]


def test_the_new_name_wins_and_nothing_is_said_without_an_old_one():
    environ, lines = {"SPECVIEW_THINMM": "0", "SPECVIEW_THIN_KERNELS": "1"}, []
    adopt_old_names(environ, lines.append)
    assert environ["SPECVIEW_THIN_KERNELS"] == "1" and len(lines) == 1
    quiet: list[str] = []
    adopt_old_names({"SPECVIEW_PACKED_LINEAR": "0"}, quiet.append)
    assert quiet == []
