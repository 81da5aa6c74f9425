//! One method per API route.

use bytes::Bytes;
use http::Method;
use mayfly_types::UploadSummary;
use mayfly_types::{
    CreateRequest, Event, ExecAudit, ExecRequest, ExecResult, FileStat, MkdirRequest, ProcessInfo,
    ProcessOutput, RenameRequest, RunRequest, SandboxId, SandboxInfo, SandboxList, SignalRequest,
    StartProcessRequest,
};

use crate::{encode, json_body, Body, Client, ClientError, ExecStream};

fn pool(name: &str) -> String {
    format!("/v1/pools/{}", encode(name))
}

fn sandbox(id: &SandboxId) -> String {
    format!("/v1/sandboxes/{id}")
}

impl Client {
    /// `GET /v1/pools`.
    pub async fn pools(&self) -> Result<Vec<mayfly_types::PoolInfo>, ClientError> {
        let list: mayfly_types::PoolList = self.json(Method::GET, "/v1/pools", Body::Empty).await?;
        Ok(list.pools)
    }

    /// `PUT /v1/pools/{name}`: creates or changes a pool.
    pub async fn set_pool(
        &self,
        name: &str,
        spec: &mayfly_types::PoolSpec,
    ) -> Result<mayfly_types::PoolInfo, ClientError> {
        self.json(Method::PUT, &pool(name), json_body(spec)?).await
    }

    /// `POST /v1/pools/{name}/drain`: empties a pool and stops its refill.
    pub async fn drain_pool(&self, name: &str) -> Result<mayfly_types::PoolInfo, ClientError> {
        self.json(Method::POST, &format!("{}/drain", pool(name)), Body::Empty)
            .await
    }

    /// `POST /v1/sandboxes`: creates a sandbox and returns it once ready.
    pub async fn create(&self, req: &CreateRequest) -> Result<SandboxInfo, ClientError> {
        self.json(Method::POST, "/v1/sandboxes", json_body(req)?)
            .await
    }

    /// `GET /v1/sandboxes/{id}`.
    pub async fn get(&self, id: &SandboxId) -> Result<SandboxInfo, ClientError> {
        self.json(Method::GET, &sandbox(id), Body::Empty).await
    }

    /// `GET /v1/sandboxes`: live sandboxes, or every recorded one with `all`.
    pub async fn list(&self, all: bool) -> Result<Vec<SandboxInfo>, ClientError> {
        self.list_recent(all, None).await
    }

    /// `GET /v1/sandboxes[?all=true[&limit=N]]`: with `all`, the `limit`
    /// most recently created (the daemon's default when `None`).
    pub async fn list_recent(
        &self,
        all: bool,
        limit: Option<u32>,
    ) -> Result<Vec<SandboxInfo>, ClientError> {
        let path = match (all, limit) {
            (false, _) => "/v1/sandboxes".to_owned(),
            (true, None) => "/v1/sandboxes?all=true".to_owned(),
            (true, Some(n)) => format!("/v1/sandboxes?all=true&limit={n}"),
        };
        let list: SandboxList = self.json(Method::GET, &path, Body::Empty).await?;
        Ok(list.sandboxes)
    }

    /// `POST /v1/sandboxes/{id}/keepalive`: resets the idle timer and, with
    /// `ttl_secs`, moves the deadline to that long from now.
    pub async fn keepalive(
        &self,
        id: &SandboxId,
        ttl_secs: Option<u64>,
    ) -> Result<SandboxInfo, ClientError> {
        let body = mayfly_types::KeepaliveRequest { ttl_secs };
        self.json(
            Method::POST,
            &format!("{}/keepalive", sandbox(id)),
            json_body(&body)?,
        )
        .await
    }

    /// `GET /v1/sandboxes/{id}/egress`: the live egress policy.
    pub async fn egress(&self, id: &SandboxId) -> Result<mayfly_types::EgressPolicy, ClientError> {
        self.json(Method::GET, &format!("{}/egress", sandbox(id)), Body::Empty)
            .await
    }

    /// `PATCH /v1/sandboxes/{id}/egress`: replaces the policy, live.
    pub async fn set_egress(
        &self,
        id: &SandboxId,
        policy: &mayfly_types::EgressPolicy,
    ) -> Result<mayfly_types::EgressPolicy, ClientError> {
        self.json(
            Method::PATCH,
            &format!("{}/egress", sandbox(id)),
            json_body(policy)?,
        )
        .await
    }

    /// `DELETE /v1/sandboxes/{id}`: idempotent; returns the final record.
    pub async fn destroy(&self, id: &SandboxId) -> Result<SandboxInfo, ClientError> {
        self.json(Method::DELETE, &sandbox(id), Body::Empty).await
    }

    /// `POST /v1/sandboxes/{id}/exec`: runs a command and returns its
    /// buffered result.
    pub async fn exec(&self, id: &SandboxId, req: &ExecRequest) -> Result<ExecResult, ClientError> {
        let path = format!("{}/exec", sandbox(id));
        self.json(Method::POST, &path, json_body(req)?).await
    }

    /// `POST /v1/sandboxes/{id}/exec` with `Accept: text/event-stream`:
    /// returns as soon as the command started; read its output as it is
    /// produced with [`ExecStream::next_event`].
    pub async fn exec_stream(
        &self,
        id: &SandboxId,
        req: &ExecRequest,
    ) -> Result<ExecStream, ClientError> {
        let path = format!("{}/exec", sandbox(id));
        let (resp, what) = self
            .call_for_events(Method::POST, &path, json_body(req)?)
            .await?;
        Ok(ExecStream::new(resp.into_body(), what))
    }

    /// `POST /v1/run`: one command in a sandbox the daemon makes for it and
    /// destroys when the command ends (or this stream is dropped). Returns
    /// the sandbox's id and the command's stream, as for
    /// [`Client::exec_stream`].
    pub async fn run(&self, req: &RunRequest) -> Result<(SandboxId, ExecStream), ClientError> {
        let (resp, what) = self
            .call_for_events(Method::POST, "/v1/run", json_body(req)?)
            .await?;
        let id = resp
            .headers()
            .get("x-mayfly-sandbox")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<SandboxId>().ok())
            .ok_or_else(|| ClientError::Protocol {
                request: what.clone(),
                reason: "the answer does not name its sandbox (X-Mayfly-Sandbox)".to_owned(),
            })?;
        Ok((id, ExecStream::new(resp.into_body(), what)))
    }

    /// A request answered with `text/event-stream`; any other answer is a
    /// protocol error.
    pub(crate) async fn call_for_events(
        &self,
        method: Method,
        path: &str,
        body: Body,
    ) -> Result<(hyper::Response<hyper::body::Incoming>, String), ClientError> {
        let (resp, what) = self
            .call(method, path, body, Some("text/event-stream"))
            .await?;
        let is_sse = resp
            .headers()
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|ct| ct.starts_with("text/event-stream"));
        if !is_sse {
            return Err(ClientError::Protocol {
                request: what,
                reason: "expected a text/event-stream answer".to_owned(),
            });
        }
        Ok((resp, what))
    }

    /// `POST /v1/sandboxes/{id}/processes`: starts a background command.
    pub async fn start_process(
        &self,
        id: &SandboxId,
        req: &StartProcessRequest,
    ) -> Result<ProcessInfo, ClientError> {
        let path = format!("{}/processes", sandbox(id));
        self.json(Method::POST, &path, json_body(req)?).await
    }

    /// `GET /v1/sandboxes/{id}/processes`.
    pub async fn list_processes(&self, id: &SandboxId) -> Result<Vec<ProcessInfo>, ClientError> {
        let path = format!("{}/processes", sandbox(id));
        self.json(Method::GET, &path, Body::Empty).await
    }

    /// `GET …/services`: the sandbox's services and where each is.
    pub async fn services(
        &self,
        id: &SandboxId,
    ) -> Result<Vec<mayfly_types::ServiceInfo>, ClientError> {
        let path = format!("{}/services", sandbox(id));
        self.json(Method::GET, &path, Body::Empty).await
    }

    /// `POST …/processes/{handle}/wait`: waits for exit, or at most
    /// `timeout_ms`, and returns the process's state.
    pub async fn wait_process(
        &self,
        id: &SandboxId,
        handle: u64,
        timeout_ms: Option<u64>,
    ) -> Result<ProcessInfo, ClientError> {
        let mut path = format!("{}/processes/{handle}/wait", sandbox(id));
        if let Some(t) = timeout_ms {
            path.push_str(&format!("?timeout_ms={t}"));
        }
        self.json(Method::POST, &path, Body::Empty).await
    }

    /// `GET …/processes/{handle}/output`: output so far, and the state.
    pub async fn process_output(
        &self,
        id: &SandboxId,
        handle: u64,
    ) -> Result<ProcessOutput, ClientError> {
        let path = format!("{}/processes/{handle}/output", sandbox(id));
        self.json(Method::GET, &path, Body::Empty).await
    }

    /// `POST …/processes/{handle}/kill`: sends `signal` (SIGKILL when `None`).
    pub async fn signal_process(
        &self,
        id: &SandboxId,
        handle: u64,
        signal: Option<i32>,
    ) -> Result<ProcessInfo, ClientError> {
        let path = format!("{}/processes/{handle}/kill", sandbox(id));
        self.json(Method::POST, &path, json_body(&SignalRequest { signal })?)
            .await
    }

    /// `GET …/files?path=P`: a file's bytes.
    pub async fn read_file(&self, id: &SandboxId, path: &str) -> Result<Bytes, ClientError> {
        let p = format!("{}/files?path={}", sandbox(id), encode(path));
        self.bytes(Method::GET, &p).await
    }

    /// `PUT …/files?path=P[&mode=M]`: writes (creates or truncates) a file.
    pub async fn write_file(
        &self,
        id: &SandboxId,
        path: &str,
        data: impl Into<Bytes>,
        mode: Option<u32>,
    ) -> Result<FileStat, ClientError> {
        let mut p = format!("{}/files?path={}", sandbox(id), encode(path));
        if let Some(mode) = mode {
            p.push_str(&format!("&mode={mode:o}"));
        }
        let body = Body::Raw(data.into(), "application/octet-stream");
        self.json(Method::PUT, &p, body).await
    }

    /// `GET …/files/stat?path=P`.
    pub async fn stat(&self, id: &SandboxId, path: &str) -> Result<FileStat, ClientError> {
        let p = format!("{}/files/stat?path={}", sandbox(id), encode(path));
        self.json(Method::GET, &p, Body::Empty).await
    }

    /// `GET …/files/list?path=P`: a directory's entries.
    pub async fn list_dir(&self, id: &SandboxId, path: &str) -> Result<Vec<FileStat>, ClientError> {
        let p = format!("{}/files/list?path={}", sandbox(id), encode(path));
        self.json(Method::GET, &p, Body::Empty).await
    }

    /// `POST …/files/mkdir`.
    pub async fn mkdir(&self, id: &SandboxId, req: &MkdirRequest) -> Result<FileStat, ClientError> {
        let p = format!("{}/files/mkdir", sandbox(id));
        self.json(Method::POST, &p, json_body(req)?).await
    }

    /// `DELETE …/files?path=P[&recursive=true]`.
    pub async fn remove(
        &self,
        id: &SandboxId,
        path: &str,
        recursive: bool,
    ) -> Result<(), ClientError> {
        let mut p = format!("{}/files?path={}", sandbox(id), encode(path));
        if recursive {
            p.push_str("&recursive=true");
        }
        self.empty(Method::DELETE, &p, Body::Empty).await
    }

    /// `POST …/files/rename`.
    pub async fn rename(&self, id: &SandboxId, req: &RenameRequest) -> Result<(), ClientError> {
        let p = format!("{}/files/rename", sandbox(id));
        self.empty(Method::POST, &p, json_body(req)?).await
    }

    /// `PUT …/archive?path=DIR`: unpacks a tar archive into `dir`.
    pub async fn upload_tar(
        &self,
        id: &SandboxId,
        dir: &str,
        tar: impl Into<Bytes>,
    ) -> Result<UploadSummary, ClientError> {
        let p = format!("{}/archive?path={}", sandbox(id), encode(dir));
        self.json(Method::PUT, &p, Body::Raw(tar.into(), "application/x-tar"))
            .await
    }

    /// `GET …/archive?path=P`: a tar archive of a file or directory.
    pub async fn download_tar(&self, id: &SandboxId, path: &str) -> Result<Bytes, ClientError> {
        let p = format!("{}/archive?path={}", sandbox(id), encode(path));
        self.bytes(Method::GET, &p).await
    }

    /// `GET …/artifacts`: the sandbox's collected artifacts (empty until
    /// its destroy collected them; answered after it is gone).
    pub async fn list_artifacts(
        &self,
        id: &SandboxId,
    ) -> Result<mayfly_types::ArtifactList, ClientError> {
        let p = format!("{}/artifacts", sandbox(id));
        self.json(Method::GET, &p, Body::Empty).await
    }

    /// `GET …/artifacts/{name}`: one artifact's bytes.
    pub async fn get_artifact(&self, id: &SandboxId, name: &str) -> Result<Bytes, ClientError> {
        let p = format!("{}/artifacts/{}", sandbox(id), encode(name));
        self.bytes(Method::GET, &p).await
    }

    /// `GET /v1/events?since=N&limit=M`: lifecycle events after `since`.
    pub async fn events(&self, since: i64, limit: u32) -> Result<Vec<Event>, ClientError> {
        let p = format!("/v1/events?since={since}&limit={limit}");
        self.json(Method::GET, &p, Body::Empty).await
    }

    /// `GET /v1/sandboxes/{id}/audit`: the exec audit trail.
    pub async fn audit(&self, id: &SandboxId) -> Result<Vec<ExecAudit>, ClientError> {
        let p = format!("{}/audit", sandbox(id));
        self.json(Method::GET, &p, Body::Empty).await
    }
}
