//! Gateway routes: service name → baseline URL. The gateway keeps them in
//! memory; the store only makes them outlive the daemon.

use rusqlite::params;

use crate::{Store, StoreError};

impl Store {
    /// Every route, by name: `(name, url)`.
    pub fn routes(&self) -> Result<Vec<(String, String)>, StoreError> {
        let conn = self.conn();
        let mut stmt = conn.prepare_cached("SELECT name, url FROM routes ORDER BY name")?;
        let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?;
        Ok(rows.collect::<Result<Vec<_>, _>>()?)
    }

    /// Creates or replaces a route.
    pub fn put_route(&self, name: &str, url: &str) -> Result<(), StoreError> {
        let now = self.now() as i64;
        self.conn().execute(
            "INSERT INTO routes (name, url, created_at, updated_at) VALUES (?1, ?2, ?3, ?3)
             ON CONFLICT (name) DO UPDATE SET url = excluded.url, updated_at = excluded.updated_at",
            params![name, url, now],
        )?;
        Ok(())
    }

    /// Removes a route; false if there was none.
    pub fn delete_route(&self, name: &str) -> Result<bool, StoreError> {
        Ok(self
            .conn()
            .execute("DELETE FROM routes WHERE name = ?1", [name])?
            > 0)
    }
}

#[cfg(test)]
mod tests {
    use crate::Store;

    #[test]
    fn routes_are_put_replaced_listed_and_removed() {
        let s = Store::open_in_memory().unwrap();
        s.put_route("b", "http://127.0.0.1:2").unwrap();
        s.put_route("a", "http://127.0.0.1:1").unwrap();
        s.put_route("a", "http://127.0.0.1:3").unwrap();
        assert_eq!(
            s.routes().unwrap(),
            vec![
                ("a".into(), "http://127.0.0.1:3".into()),
                ("b".into(), "http://127.0.0.1:2".into())
            ]
        );
        assert!(s.delete_route("a").unwrap());
        assert!(!s.delete_route("a").unwrap());
        assert_eq!(s.routes().unwrap().len(), 1);
    }
}
