//! API keys and the admin routes: tenants and keys.

use http::{HeaderValue, Method};
use mayfly_types::{
    CreateKeyRequest, CreatedKey, KeyInfo, KeyList, TenantInfo, TenantList, TenantQuotas,
};

use crate::{encode, json_body, Body, Client, ClientError};

impl Client {
    /// The same client, sending `Authorization: Bearer <key>` on every
    /// request: an API key (`mfk_…`), on the unix socket or TCP, which
    /// replaces any token given to [`Client::tcp`].
    pub fn with_api_key(mut self, key: &str) -> Result<Client, ClientError> {
        let value = HeaderValue::from_str(&format!("Bearer {key}")).map_err(|_| {
            ClientError::InvalidUrl {
                url: self.target.to_string(),
                reason: "the API key contains characters not allowed in a header".to_owned(),
            }
        })?;
        self.auth = Some(value);
        Ok(self)
    }

    /// `GET /v1/tenants`: every tenant with its quotas and usage.
    pub async fn tenants(&self) -> Result<Vec<TenantInfo>, ClientError> {
        let list: TenantList = self.json(Method::GET, "/v1/tenants", Body::Empty).await?;
        Ok(list.tenants)
    }

    /// `GET /v1/tenants/{name}`.
    pub async fn tenant(&self, name: &str) -> Result<TenantInfo, ClientError> {
        self.json(Method::GET, &tenant_path(name), Body::Empty)
            .await
    }

    /// `PUT /v1/tenants/{name}`: creates the tenant or replaces its quotas
    /// (an absent quota is unlimited).
    pub async fn put_tenant(
        &self,
        name: &str,
        quotas: &TenantQuotas,
    ) -> Result<TenantInfo, ClientError> {
        self.json(Method::PUT, &tenant_path(name), json_body(quotas)?)
            .await
    }

    /// `DELETE /v1/tenants/{name}`: removes a tenant without live
    /// sandboxes and revokes its keys.
    pub async fn delete_tenant(&self, name: &str) -> Result<(), ClientError> {
        self.empty(Method::DELETE, &tenant_path(name), Body::Empty)
            .await
    }

    /// `POST /v1/keys`: a new key; the answer's `secret` is shown only once.
    pub async fn create_key(&self, req: &CreateKeyRequest) -> Result<CreatedKey, ClientError> {
        self.json(Method::POST, "/v1/keys", json_body(req)?).await
    }

    /// `GET /v1/keys`: every key, revoked ones included.
    pub async fn keys(&self) -> Result<Vec<KeyInfo>, ClientError> {
        let list: KeyList = self.json(Method::GET, "/v1/keys", Body::Empty).await?;
        Ok(list.keys)
    }

    /// `DELETE /v1/keys/{id}`: revokes a key.
    pub async fn revoke_key(&self, id: &str) -> Result<KeyInfo, ClientError> {
        let p = format!("/v1/keys/{}", encode(id));
        self.json(Method::DELETE, &p, Body::Empty).await
    }
}

fn tenant_path(name: &str) -> String {
    // `encode` keeps `/`, which a name never has; the daemon refuses it.
    format!("/v1/tenants/{}", encode(name).replace('/', "%2F"))
}
