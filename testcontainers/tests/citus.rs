//! The Citus source: a coordinator and workers, each test database on every node with Citus in
//! it and the workers added, dropped on every node. Skips with one line without Citus
//! (`PGTENANT_REQUIRE_CITUS=1` fails instead).

use std::sync::Arc;

use pgtenant_testkit::{skip_without_citus, CitusCluster};

#[tokio::test]
async fn a_citus_cluster_places_a_distributed_schema_on_a_worker_and_cleans_up_every_node() {
    if skip_without_citus("a_citus_cluster_places_a_distributed_schema_on_a_worker") {
        return;
    }
    let cluster = Arc::new(CitusCluster::start(1).await.expect("cluster"));
    assert_eq!(cluster.worker_ports().len(), 1);
    let db = cluster.create_database().await.expect("database");
    assert!(db
        .url()
        .contains(&format!(":{}/", cluster.coordinator_port())));
    let client = db.connect().await.expect("connect");
    let workers: i64 = client
        .query_one("SELECT count(*) FROM citus_get_active_worker_nodes()", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(workers, 1);
    client
        .batch_execute(
            "SET citus.enable_schema_based_sharding = on;
             CREATE SCHEMA tenant;
             CREATE TABLE tenant.t (id int PRIMARY KEY);
             INSERT INTO tenant.t VALUES (1)",
        )
        .await
        .expect("a distributed schema");
    let port: i32 = client
        .query_one(
            "SELECT DISTINCT nodeport FROM citus_shards WHERE table_name::text = 'tenant.t'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(port, i32::from(cluster.worker_ports()[0]));
    let name = db.name().to_owned();
    drop(client);
    drop(db);
    let mut worker = tokio_postgres::Config::new();
    worker
        .host("127.0.0.1")
        .port(cluster.worker_ports()[0])
        .user("postgres")
        .dbname("postgres");
    let (admin, connection) = worker.connect(tokio_postgres::NoTls).await.expect("worker");
    tokio::spawn(connection);
    let left: i64 = admin
        .query_one(
            "SELECT count(*) FROM pg_database WHERE datname = $1",
            &[&name],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(left, 0, "the database is dropped on the worker too");
}
