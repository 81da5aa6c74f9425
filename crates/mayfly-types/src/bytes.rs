//! Binary-safe byte strings on a JSON wire.

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Arbitrary bytes, carried as standard base64 in JSON.
///
/// Process output is not assumed to be UTF-8, so it never travels as a JSON
/// string of text.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Bytes64(pub Vec<u8>);

impl std::fmt::Debug for Bytes64 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Bytes64({} bytes)", self.0.len())
    }
}

impl From<Vec<u8>> for Bytes64 {
    fn from(v: Vec<u8>) -> Self {
        Self(v)
    }
}

impl Serialize for Bytes64 {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&STANDARD.encode(&self.0))
    }
}

impl<'de> Deserialize<'de> for Bytes64 {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        STANDARD
            .decode(s.as_bytes())
            .map(Bytes64)
            .map_err(|e| serde::de::Error::custom(format!("invalid base64: {e}")))
    }
}

impl utoipa::PartialSchema for Bytes64 {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        utoipa::openapi::ObjectBuilder::new()
            .schema_type(utoipa::openapi::schema::Type::String)
            .format(Some(utoipa::openapi::SchemaFormat::KnownFormat(
                utoipa::openapi::KnownFormat::Byte,
            )))
            .description(Some("Standard base64 of arbitrary bytes."))
            .into()
    }
}

impl utoipa::ToSchema for Bytes64 {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_round_trip_through_json_exactly() {
        let all: Vec<u8> = (0..=255u8).collect();
        let json = serde_json::to_string(&Bytes64(all.clone())).unwrap();
        let back: Bytes64 = serde_json::from_str(&json).unwrap();
        assert_eq!(back.0, all);
    }

    #[test]
    fn invalid_base64_is_rejected() {
        assert!(serde_json::from_str::<Bytes64>("\"@@@\"").is_err());
    }
}
