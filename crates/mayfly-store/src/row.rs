//! Decoding rows without trusting them: every column that fails to convert
//! becomes `StoreError::Corrupt` naming the table, the row and the field.

use rusqlite::types::{FromSql, ValueRef};
use rusqlite::Row;
use serde::de::DeserializeOwned;

use crate::StoreError;

/// One row being decoded, with the key used to name it in errors.
pub(crate) struct Cols<'r, 's> {
    row: &'r Row<'s>,
    table: &'static str,
    key: String,
}

impl<'r, 's> Cols<'r, 's> {
    /// Names the row by the text (or integer) in column `key_idx`, read
    /// leniently so a corrupt key still yields a readable error.
    pub(crate) fn new(row: &'r Row<'s>, table: &'static str, key_idx: usize) -> Self {
        let key = match row.get_ref(key_idx) {
            Ok(ValueRef::Text(t)) => String::from_utf8_lossy(t).into_owned(),
            Ok(ValueRef::Integer(i)) => i.to_string(),
            Ok(other) => format!("<{:?}>", other.data_type()),
            Err(_) => "<unreadable>".to_owned(),
        };
        Cols { row, table, key }
    }

    pub(crate) fn key(&self) -> &str {
        &self.key
    }

    pub(crate) fn corrupt(&self, field: &'static str, reason: impl Into<String>) -> StoreError {
        StoreError::Corrupt {
            table: self.table,
            id: self.key.clone(),
            field,
            reason: reason.into(),
        }
    }

    /// Reads a column; a value of the wrong type or range is corruption,
    /// anything else (a bad column index) is an ordinary sqlite error.
    pub(crate) fn get<T: FromSql>(&self, idx: usize, field: &'static str) -> Result<T, StoreError> {
        self.row.get(idx).map_err(|e| match e {
            rusqlite::Error::FromSqlConversionFailure(..)
            | rusqlite::Error::IntegralValueOutOfRange(..)
            | rusqlite::Error::InvalidColumnType(..)
            | rusqlite::Error::Utf8Error(..) => self.corrupt(field, e.to_string()),
            other => StoreError::Sqlite(other),
        })
    }

    /// Reads a TEXT column holding JSON.
    pub(crate) fn json<T: DeserializeOwned>(
        &self,
        idx: usize,
        field: &'static str,
    ) -> Result<T, StoreError> {
        let text: String = self.get(idx, field)?;
        serde_json::from_str(&text).map_err(|e| self.corrupt(field, e.to_string()))
    }

    /// Reads a TEXT column through `FromStr`.
    pub(crate) fn parse<T>(&self, idx: usize, field: &'static str) -> Result<T, StoreError>
    where
        T: std::str::FromStr,
        T::Err: std::fmt::Display,
    {
        let text: String = self.get(idx, field)?;
        text.parse()
            .map_err(|e: T::Err| self.corrupt(field, e.to_string()))
    }
}
