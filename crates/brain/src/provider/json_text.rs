//! JSON strings read straight out of the bytes they arrived in: what a stream decoder
//! deserializes each event's text into, so a delta's words are copied once (into the
//! delta) instead of into a `String` or a `serde_json::Value` first.
//!
//! A string without escapes is borrowed from the event; one with escapes is unescaped into
//! an owned string, as it must be.

use std::borrow::Cow;
use std::fmt;

use serde::de::value::{MapAccessDeserializer, SeqAccessDeserializer};
use serde::de::{Deserialize, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

/// A JSON string (and only a string: anything else is a deserialization error).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Text<'a>(pub(crate) Cow<'a, str>);

impl Text<'_> {
    pub(crate) fn as_str(&self) -> &str {
        &self.0
    }
}

/// The text of an optional string field.
pub(crate) fn text<'t>(field: Option<&'t Text<'_>>) -> Option<&'t str> {
    field.map(Text::as_str)
}

/// The string arms of a visitor whose value is the text (a `Cow`, or `Some` of one): borrowed
/// when the deserializer can lend it, else owned.
macro_rules! strings_are_text {
    () => {
        fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Self::Value, E> {
            Ok(Cow::Borrowed(v).into())
        }

        fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
            Ok(Cow::<str>::Owned(v.to_owned()).into())
        }

        fn visit_string<E>(self, v: String) -> Result<Self::Value, E> {
            Ok(Cow::<str>::Owned(v).into())
        }
    };
}

struct TextVisitor;

impl<'de> Visitor<'de> for TextVisitor {
    type Value = Cow<'de, str>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string")
    }

    strings_are_text!();
}

impl<'de: 'a, 'a> Deserialize<'de> for Text<'a> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_str(TextVisitor).map(Text)
    }
}

/// A Chat Completions `content`: a string by the spec, sometimes an array of parts whose
/// `text` members are joined; anything else (`null`, a number, an object) holds no text.
/// Never an error, so one odd field does not cost the event its other members.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Content<'a>(pub(crate) Option<Cow<'a, str>>);

impl<'de: 'a, 'a> Deserialize<'de> for Content<'a> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer
            .deserialize_any(AnyText { parts: true })
            .map(Content)
    }
}

/// A string's text; anything else is no text (and no error).
struct MaybeText<'a>(Option<Cow<'a, str>>);

impl<'de: 'a, 'a> Deserialize<'de> for MaybeText<'a> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer
            .deserialize_any(AnyText { parts: false })
            .map(MaybeText)
    }
}

/// One element of a content array: the string `text` member of an object (the last one,
/// should it repeat), or nothing.
struct PartText<'a>(Option<Cow<'a, str>>);

impl<'de: 'a, 'a> Deserialize<'de> for PartText<'a> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(Part).map(PartText)
    }
}

/// Text from any JSON value: a string is its text; with `parts`, an array is its parts'
/// texts joined ([`PartText`]); everything else is read through and is none.
struct AnyText {
    parts: bool,
}

/// A content part: an object's `text` member; everything else is read through and is none.
struct Part;

/// The arms both visitors share: scalars and `null` hold no text.
macro_rules! no_text_from_scalars {
    () => {
        fn visit_unit<E>(self) -> Result<Self::Value, E> {
            Ok(None)
        }

        fn visit_none<E>(self) -> Result<Self::Value, E> {
            Ok(None)
        }

        fn visit_some<D: Deserializer<'de>>(
            self,
            deserializer: D,
        ) -> Result<Self::Value, D::Error> {
            deserializer.deserialize_any(self)
        }

        fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
            Ok(None)
        }

        fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
            Ok(None)
        }

        fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
            Ok(None)
        }

        fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
            Ok(None)
        }
    };
}

impl<'de> Visitor<'de> for AnyText {
    type Value = Option<Cow<'de, str>>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    no_text_from_scalars!();

    strings_are_text!();

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        if !self.parts {
            while seq.next_element::<IgnoredAny>()?.is_some() {}
            return Ok(None);
        }
        let mut joined = String::new();
        while let Some(part) = seq.next_element::<PartText<'de>>()? {
            if let Some(text) = part.0 {
                joined.push_str(&text);
            }
        }
        Ok(Some(Cow::Owned(joined)))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(None)
    }
}

impl<'de> Visitor<'de> for Part {
    type Value = Option<Cow<'de, str>>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a content part")
    }

    no_text_from_scalars!();

    fn visit_str<E>(self, _: &str) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(None)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut text = None;
        while let Some(key) = map.next_key::<Text<'de>>()? {
            if key.as_str() == "text" {
                text = map.next_value::<MaybeText<'de>>()?.0;
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(text)
    }
}

/// Tool-call `arguments`: a string by the spec, taken as it is; some servers send the
/// object itself, which becomes its compact JSON text; `null` is none.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Arguments<'a>(pub(crate) Option<Cow<'a, str>>);

impl<'de: 'a, 'a> Deserialize<'de> for Arguments<'a> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer
            .deserialize_any(ArgumentsVisitor)
            .map(Arguments)
    }
}

/// Anything but a string or `null` is rare, and small: it goes through a `Value`, so its
/// text is exactly what `Value`'s `Display` writes.
struct ArgumentsVisitor;

impl<'de> Visitor<'de> for ArgumentsVisitor {
    type Value = Option<Cow<'de, str>>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("tool-call arguments")
    }

    strings_are_text!();

    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_none<E>(self) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_any(self)
    }

    fn visit_bool<E>(self, v: bool) -> Result<Self::Value, E> {
        Ok(Some(Cow::Owned(serde_json::Value::from(v).to_string())))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Self::Value, E> {
        Ok(Some(Cow::Owned(serde_json::Value::from(v).to_string())))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Self::Value, E> {
        Ok(Some(Cow::Owned(serde_json::Value::from(v).to_string())))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Self::Value, E> {
        Ok(Some(Cow::Owned(serde_json::Value::from(v).to_string())))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
        let value = serde_json::Value::deserialize(SeqAccessDeserializer::new(seq))?;
        Ok(Some(Cow::Owned(value.to_string())))
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        let value = serde_json::Value::deserialize(MapAccessDeserializer::new(map))?;
        Ok(Some(Cow::Owned(value.to_string())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, serde::Deserialize)]
    struct Fields<'a> {
        #[serde(borrow, default)]
        content: Option<Content<'a>>,
        #[serde(borrow, default)]
        arguments: Option<Arguments<'a>>,
        #[serde(borrow, default)]
        name: Option<Text<'a>>,
    }

    /// What `content`, `arguments` and `name` read as, from `json`.
    fn check(json: &str, content: Option<&str>, arguments: Option<&str>, name: Option<&str>) {
        let fields: Fields<'_> = serde_json::from_str(json).unwrap();
        assert_eq!(
            fields.content.and_then(|c| c.0).as_deref(),
            content,
            "content of {json}"
        );
        assert_eq!(
            fields.arguments.and_then(|a| a.0).as_deref(),
            arguments,
            "arguments of {json}"
        );
        assert_eq!(text(fields.name.as_ref()), name, "name of {json}");
    }

    #[test]
    fn strings_are_borrowed_unless_escaped() {
        let plain: Text<'_> = serde_json::from_str(r#""héllo""#).unwrap();
        assert!(matches!(plain.0, Cow::Borrowed("héllo")));
        let escaped: Text<'_> = serde_json::from_str(r#""a\nb\u00e9""#).unwrap();
        assert!(matches!(escaped.0, Cow::Owned(ref s) if s == "a\nbé"));
        let content: Content<'_> = serde_json::from_str(r#""hi""#).unwrap();
        assert!(matches!(content.0, Some(Cow::Borrowed("hi"))));
        assert!(serde_json::from_str::<Text<'_>>("7").is_err());
    }

    #[test]
    fn every_shape_of_content_and_arguments() {
        check(
            r#"{"content":"hi","name":"a\"b"}"#,
            Some("hi"),
            None,
            Some("a\"b"),
        );
        check(r#"{"content":null,"arguments":null}"#, None, None, None);
        check(
            r#"{"content":[{"type":"text","text":"a"},{"text":7},"x",{"text":"b","text":"c"},[1]]}"#,
            Some("ac"),
            None,
            None,
        );
        check(r#"{"content":[]}"#, Some(""), None, None);
        check(
            r#"{"content":{"text":"no"},"arguments":{"b":[1,2.5],"a":true}}"#,
            None,
            Some(r#"{"b":[1,2.5],"a":true}"#),
            None,
        );
        check(
            r#"{"content":3,"arguments":[1,"x"]}"#,
            None,
            Some(r#"[1,"x"]"#),
            None,
        );
        check(
            r#"{"content":true,"arguments":"{\"k\": 1}"}"#,
            None,
            Some(r#"{"k": 1}"#),
            None,
        );
        check(r#"{"arguments":2.5}"#, None, Some("2.5"), None);
        check(r#"{"arguments":false}"#, None, Some("false"), None);
    }
}
