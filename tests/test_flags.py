"""bim.flags.comma_floats: a list of numbers in each shape a command line hands it over, and one clear error."""

import pytest

from bim.flags import comma_floats


@pytest.mark.parametrize("value, expected", [("2,4,8", (2.0, 4.0, 8.0)), (" 0.5, 1 ,", (0.5, 1.0)), (1, (1.0,)),
                                             (0.75, (0.75,)), ((2, 4), (2.0, 4.0)), ([3], (3.0,)), ("", ())])
def test_a_number_list_arrives_as_floats_whatever_shape_the_command_line_gave(value, expected):
    assert comma_floats(value, "--powers") == expected


@pytest.mark.parametrize("value", ["two", "1,x", "0", "-1,2", (1, 0), None])
def test_anything_else_is_one_error_naming_the_option_and_an_example(value):
    expected = r"^--powers: expected comma-separated positive numbers such as 0\.5,0\.75,1, got"
    with pytest.raises(ValueError, match=expected):
        comma_floats(value, "--powers")


def test_without_positive_zero_and_negative_numbers_pass():
    assert comma_floats("0,-1.5", "--shift", "0,1", positive=False) == (0.0, -1.5)
    with pytest.raises(ValueError, match=r"^--shift: expected comma-separated numbers such as 0,1, got 'a'"):
        comma_floats("a", "--shift", "0,1", positive=False)
