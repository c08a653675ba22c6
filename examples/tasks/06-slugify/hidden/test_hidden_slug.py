from slug import slugify


def test_spaces_and_case():
    assert slugify("  Nerve  Runs   Agents ") == "nerve-runs-agents"


def test_one_word():
    assert slugify("python") == "python"
