from slug import slugify


def test_two_words():
    assert slugify("Hello World") == "hello-world"
