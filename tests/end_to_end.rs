//! The SDK against the stateful mock server: the live contract scenarios
//! 59–61 and acquire's retry recovering a lost answer.

mod common;

use std::time::Duration;

use common::mock_client;
use volcano::{Client, Error};
use volcano_mock_server::{Fault, MockServer, Operation};

const TOKEN: &str = "0B6F1A43-5B52-4F4E-9D51-1F6C3C7E2A10";
const RID: &str = "6d0c8f5e-1f0a-4b7e-9f43-6a1d2b3c4d5e";

/// Protocol scenario 59.
#[tokio::test]
async fn acquire_release_acquire_again_with_a_new_token() {
    let server = MockServer::start().await;
    let locks = mock_client(&server).locks();
    let first = locks
        .acquire("sdk-locks-001", Duration::from_secs(10))
        .await
        .unwrap();
    locks.release(&first).await.unwrap();
    let second = locks
        .acquire("sdk-locks-001", Duration::from_secs(10))
        .await
        .unwrap();
    assert_ne!(first.token(), second.token());
    assert!(second.fencing_token() > first.fencing_token());
    locks.release(&second).await.unwrap();
    assert!(server.locks().is_empty());
}

/// Protocol scenario 60.
#[tokio::test]
async fn recovery_with_caller_token_and_request_id() {
    let server = MockServer::start().await;
    let locks = mock_client(&server).locks();
    let ttl = Duration::from_secs(30);
    let first = locks
        .acquire("sdk-locks-002", ttl)
        .token(TOKEN)
        .request_id(RID)
        .await
        .unwrap();
    let recovered = locks
        .acquire("sdk-locks-002", ttl)
        .token(TOKEN)
        .request_id(RID)
        .await
        .unwrap();
    let state = locks.get("sdk-locks-002").await.unwrap();
    assert!(state.held());
    let renewed = locks
        .renew(&recovered, Duration::from_secs(60))
        .await
        .unwrap();
    locks.release(&renewed).await.unwrap();
    assert!(!locks.get("sdk-locks-002").await.unwrap().held());

    for lease in [&first, &recovered, &renewed] {
        assert_eq!(lease.token(), TOKEN, "token kept exactly as spelled");
        assert_eq!(lease.fencing_token(), first.fencing_token());
    }
    assert_eq!(state.fencing_token(), Some(first.fencing_token()));
    assert!(renewed.expires_at() > recovered.expires_at());
}

/// Protocol scenario 61.
#[tokio::test]
async fn force_release_then_reacquire_with_higher_fence() {
    let server = MockServer::start().await;
    let locks = mock_client(&server).locks();
    let ttl = Duration::from_secs(30);
    let first = locks.acquire("sdk-locks-003", ttl).await.unwrap();
    locks
        .force_release("sdk-locks-003")
        .request_id(RID)
        .await
        .unwrap();
    assert!(!locks.get("sdk-locks-003").await.unwrap().held());
    let second = locks.acquire("sdk-locks-003", ttl).await.unwrap();
    assert_ne!(first.token(), second.token());
    assert!(second.fencing_token() > first.fencing_token());
    // The displaced holder can neither renew nor release the new lease.
    let err = locks.renew(&first, ttl).await.unwrap_err();
    assert!(err.is_ownership_lost(), "{err:?}");
    let err = locks.release(&first).await.unwrap_err();
    assert!(matches!(err, Error::Conflict(_)), "{err:?}");
    assert_eq!(server.locks()[0].fencing_token, second.fencing_token());
}

#[tokio::test]
async fn acquire_retry_recovers_an_acquisition_whose_answer_was_dropped() {
    let server = MockServer::start().await;
    server.inject(Fault::drop_response().on(Operation::Acquire).times(1));
    let lease = mock_client(&server)
        .locks()
        .acquire("nightly", Duration::from_secs(30))
        .await
        .expect("the retry recovers the applied acquisition");

    let journal = server.requests();
    assert_eq!(journal.len(), 2, "{journal:?}");
    assert_eq!(
        journal[0].status,
        Some(201),
        "the first attempt was applied"
    );
    assert_eq!(journal[0].request_id, journal[1].request_id);
    assert_eq!(journal[0].fencing_token, Some(lease.fencing_token()));
    assert_eq!(
        journal[1].fencing_token,
        Some(lease.fencing_token()),
        "same lease, same fence"
    );
    let live = server.locks();
    assert_eq!(live.len(), 1, "one lease on the server");
    assert_eq!(live[0].fencing_token, lease.fencing_token());
}

#[tokio::test]
async fn acquire_retry_gets_through_one_503_and_a_reset() {
    let server = MockServer::start().await;
    let locks = mock_client(&server).locks();
    server.inject(Fault::status(503).on(Operation::Acquire).times(1));
    let lease = locks.acquire("a", Duration::from_secs(30)).await.unwrap();
    assert_eq!(lease.fencing_token(), 1);
    server.inject(Fault::reset().on(Operation::Acquire).times(1));
    locks.acquire("b", Duration::from_secs(30)).await.unwrap();
    assert_eq!(server.requests().len(), 4);

    // Nothing else retries: a dropped renewal answer is reported.
    server.inject(Fault::reset().on(Operation::Renew).times(1));
    let err = locks
        .renew(&lease, Duration::from_secs(30))
        .await
        .unwrap_err();
    assert!(err.is_transport(), "{err:?}");
    assert_eq!(server.requests().len(), 5);
}

#[tokio::test]
async fn contention_and_expiry_through_the_sdk() {
    let server = MockServer::start().await;
    let locks = mock_client(&server).locks();
    let ttl = Duration::from_secs(5);
    let holder = locks.acquire("job", ttl).await.unwrap();
    let err = locks.acquire("job", ttl).await.unwrap_err();
    assert!(err.is_lock_held(), "{err:?}");
    assert_eq!(err.status(), Some(409));

    server.advance(Duration::from_secs(7));
    let next = locks.acquire("job", ttl).await.unwrap();
    assert!(next.fencing_token() > holder.fencing_token());
    let err = locks.renew(&holder, ttl).await.unwrap_err();
    assert!(err.is_ownership_lost(), "{err:?}");
}

#[tokio::test]
async fn wrong_credentials_map_to_authentication_errors() {
    let server = MockServer::start().await;
    for key in ["wrong", server.anon_key()] {
        let err = Client::builder()
            .anon_key(server.anon_key())
            .service_key(key)
            .api_url(server.url())
            .build()
            .unwrap()
            .locks()
            .get("job")
            .await
            .unwrap_err();
        assert!(matches!(err, Error::Authentication(_)), "{err:?}");
        assert!(matches!(err.status(), Some(401 | 403)));
    }
}

#[tokio::test]
async fn rate_limit_is_reported_with_retry_after() {
    let server = MockServer::builder().rate_limit(1).start().await;
    let locks = mock_client(&server).locks();
    locks.get("job").await.unwrap();
    let err = locks.get("job").await.unwrap_err();
    assert!(matches!(err, Error::RateLimited(_)), "{err:?}");
    assert_eq!(err.code(), Some("lock_rate_limited"));
    assert!(err
        .retry_after()
        .is_some_and(|d| d >= Duration::from_secs(1)));
}
