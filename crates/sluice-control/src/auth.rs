//! Authentication of the control API: a bearer token in the `authorization`
//! metadata of every call, compared in constant time (the same token format
//! and file as the admin endpoint). Without a token the API answers anyone
//! who can reach it, so `sluice control` refuses to listen beyond loopback
//! without one.

use std::net::SocketAddr;

use sluice_admin::BearerToken;
use tonic::metadata::MetadataValue;
use tonic::service::Interceptor;
use tonic::{Request, Status};

/// Refuses an unauthenticated endpoint beyond loopback.
pub fn check_listen(addr: SocketAddr, token: Option<&BearerToken>) -> Result<(), String> {
    if token.is_none() && !addr.ip().is_loopback() {
        return Err(format!(
            "refusing to serve the control API on {addr} without authentication: \
             give --token-file, or listen on 127.0.0.1"
        ));
    }
    Ok(())
}

/// The server side: every call must carry `authorization: Bearer TOKEN`.
#[derive(Clone, Debug)]
pub struct RequireToken(pub Option<BearerToken>);

impl Interceptor for RequireToken {
    fn call(&mut self, req: Request<()>) -> Result<Request<()>, Status> {
        let Some(token) = &self.0 else { return Ok(req) };
        let presented = req
            .metadata()
            .get("authorization")
            .and_then(|v| v.as_bytes().strip_prefix(b"Bearer "))
            .unwrap_or(b"");
        if token.matches(presented) {
            Ok(req)
        } else {
            let peer = req
                .remote_addr()
                .map_or_else(|| "unknown".to_owned(), |a| a.to_string());
            tracing::warn!(%peer, "control API call refused: missing or wrong bearer token");
            Err(Status::unauthenticated("missing or wrong bearer token"))
        }
    }
}

/// The client side: attaches the token to every call.
#[derive(Clone, Debug)]
pub struct AttachToken(pub Option<MetadataValue<tonic::metadata::Ascii>>);

impl AttachToken {
    pub fn new(token: Option<&BearerToken>) -> AttachToken {
        // A BearerToken is visible ASCII, which a header value always takes.
        AttachToken(token.and_then(|t| format!("Bearer {}", t.expose()).parse().ok()))
    }
}

impl Interceptor for AttachToken {
    fn call(&mut self, mut req: Request<()>) -> Result<Request<()>, Status> {
        if let Some(v) = &self.0 {
            req.metadata_mut().insert("authorization", v.clone());
        }
        Ok(req)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn beyond_loopback_needs_a_token() {
        let t = BearerToken::new("s3cret");
        assert!(check_listen("127.0.0.1:9500".parse().unwrap(), None).is_ok());
        assert!(check_listen("[::1]:9500".parse().unwrap(), None).is_ok());
        let e = check_listen("0.0.0.0:9500".parse().unwrap(), None).unwrap_err();
        assert!(e.contains("--token-file"), "{e}");
        assert!(check_listen("0.0.0.0:9500".parse().unwrap(), t.as_ref()).is_ok());
    }

    #[test]
    fn wrong_or_missing_tokens_are_refused() {
        let mut check = RequireToken(BearerToken::new("s3cret"));
        assert_eq!(
            check.call(Request::new(())).unwrap_err().code(),
            tonic::Code::Unauthenticated
        );
        let mut attach = AttachToken::new(BearerToken::new("wrong").as_ref());
        let req = attach.call(Request::new(())).unwrap();
        assert_eq!(
            check.call(req).unwrap_err().code(),
            tonic::Code::Unauthenticated
        );
        let mut attach = AttachToken::new(BearerToken::new("s3cret").as_ref());
        assert!(check.call(attach.call(Request::new(())).unwrap()).is_ok());
    }
}
