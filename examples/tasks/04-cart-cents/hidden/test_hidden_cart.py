from cart import Cart
from money import format_price


def test_format_small():
    assert format_price(5) == "$0.05"


def test_empty_cart():
    assert Cart().summary() == "Total: $0.00"


def test_one_item():
    cart = Cart()
    cart.add("book", 1999)
    assert cart.summary() == "Total: $19.99"
