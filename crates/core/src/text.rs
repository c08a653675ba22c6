//! Small text helpers every layer needs when it shortens what it shows or stores.

/// `text` cut to at most `max` bytes, at a character boundary (the whole text when it is
/// short enough).
pub fn clip(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let cut = (0..=max)
        .rev()
        .find(|&i| text.is_char_boundary(i))
        .unwrap_or(0);
    &text[..cut]
}

#[cfg(test)]
mod tests {
    use super::clip;

    #[test]
    fn clips_at_a_character_boundary() {
        assert_eq!(clip("abcdef", 10), "abcdef");
        assert_eq!(clip("abcdef", 3), "abc");
        // "é" is two bytes: a cut inside it falls back before it.
        assert_eq!(clip("aé", 2), "a");
        assert_eq!(clip("aé", 3), "aé");
        assert_eq!(clip("", 0), "");
    }
}
