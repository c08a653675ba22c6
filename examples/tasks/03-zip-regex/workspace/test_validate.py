from validate import is_zip_code


def test_accepts_five_digits():
    assert is_zip_code("12345")


def test_rejects_six_digits():
    assert not is_zip_code("123456")
