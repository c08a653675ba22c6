from validate import is_zip_code


def test_rejects_letters_and_short():
    assert not is_zip_code("1234a")
    assert not is_zip_code("1234")
    assert not is_zip_code(" 12345")


def test_accepts_another():
    assert is_zip_code("90210")
