//! The web view's logins. A login with a token makes a session: a random id, the cookie's
//! value, that stands for the token in this server's memory. The cookie never holds the
//! token itself, so logging out ends the session and its cookie is refused from then on,
//! even if a copy of it was kept; the token stays valid for the API and a new login.
//! Every use of a session checks its token again, so a revoked token ends its sessions at
//! once. Sessions end after [`LIFETIME`] and with the server (log in again after a restart).

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use ring::rand::SecureRandom;
use secrecy::SecretString;

/// How long a login lasts (the cookie's `Max-Age` too).
pub(crate) const LIFETIME: Duration = Duration::from_secs(12 * 60 * 60);
/// The most sessions held at once: past it, a login ends the oldest.
const MOST: usize = 10_000;

/// A session's id as the map keeps it: its SHA-256, so the map never holds a cookie's value.
type Key = [u8; 32];

#[derive(Debug)]
struct Session {
    token: SecretString,
    started: Instant,
}

#[derive(Debug, Default)]
pub(crate) struct Sessions {
    live: Mutex<HashMap<Key, Session>>,
}

fn key(id: &str) -> Key {
    let digest = ring::digest::digest(&ring::digest::SHA256, id.as_bytes());
    let mut key = [0; 32];
    key.copy_from_slice(digest.as_ref());
    key
}

impl Sessions {
    /// A new session for `token`: the cookie's value (`None` when the system gives no
    /// randomness).
    pub(crate) fn start(&self, token: &str) -> Option<String> {
        let mut bytes = [0u8; 32];
        ring::rand::SystemRandom::new().fill(&mut bytes).ok()?;
        let id: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        let mut live = self.live.lock().unwrap_or_else(PoisonError::into_inner);
        if live.len() >= MOST {
            live.retain(|_, session| session.started.elapsed() < LIFETIME);
        }
        if live.len() >= MOST
            && let Some(oldest) = live
                .iter()
                .min_by_key(|(_, session)| session.started)
                .map(|(key, _)| *key)
        {
            live.remove(&oldest);
        }
        live.insert(
            key(&id),
            Session {
                token: SecretString::from(token.to_owned()),
                started: Instant::now(),
            },
        );
        Some(id)
    }

    /// The token session `id` stands for, while it lasts.
    pub(crate) fn token(&self, id: &str) -> Option<SecretString> {
        let key = key(id);
        let mut live = self.live.lock().unwrap_or_else(PoisonError::into_inner);
        match live.get(&key) {
            Some(session) if session.started.elapsed() < LIFETIME => Some(session.token.clone()),
            Some(_) => {
                live.remove(&key);
                None
            }
            None => None,
        }
    }

    /// Ends session `id` (logging out).
    pub(crate) fn end(&self, id: &str) {
        self.live
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&key(id));
    }
}

#[cfg(test)]
mod tests {
    use secrecy::ExposeSecret;

    use super::*;

    #[test]
    fn a_session_stands_for_its_token_until_it_ends() {
        let sessions = Sessions::default();
        let id = sessions.start("nerve_abc").unwrap();
        assert_eq!(id.len(), 64);
        assert!(!id.contains("nerve_abc"));
        let other = sessions.start("nerve_abc").unwrap();
        assert_ne!(id, other, "each login its own session");
        assert_eq!(
            sessions.token(&id).map(|t| t.expose_secret().to_owned()),
            Some("nerve_abc".to_owned())
        );
        sessions.end(&id);
        assert!(sessions.token(&id).is_none());
        assert!(sessions.token(&other).is_some(), "the other login lasts");
        assert!(sessions.token("not a session").is_none());
    }
}
