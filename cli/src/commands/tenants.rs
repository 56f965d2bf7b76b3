//! `pgtenant tenants`: a page of tenant records, filtered, and where the next page starts.

use crate::cli::{self, Connection};
use crate::commands::{check_control_plane, connect, Access};
use crate::error::CliError;
use crate::output::{self, out, print_tenants};

pub(crate) async fn run(connection: &Connection, args: &cli::Tenants) -> Result<(), CliError> {
    let mut query = pgtenant::admin::TenantQuery::default();
    query.owner = args
        .owner
        .as_deref()
        .map(pgtenant::ReplicaId::new)
        .transpose()
        .map_err(pgtenant::Error::from)?;
    query.state = args.state.as_deref().map(str::parse).transpose()?;
    query.after = args.after.clone();
    query.limit = args.limit;
    query.behind = args.behind.map(pgtenant::SchemaVersion::new);
    query.quarantined = match (args.quarantined, args.healthy) {
        (true, _) => Some(true),
        (_, true) => Some(false),
        _ => None,
    };
    let (_, connected) = connect(connection).await?;
    let client = &connected.client;
    check_control_plane(client, Access::Read).await?;
    let records = pgtenant::admin::list_tenants(client, &query).await?;
    // A full page has a next one only if a tenant follows its last: ask for one.
    let next_after = match records.last() {
        Some(last) if records.len() as i64 == query.limit => {
            let mut probe = query.clone();
            probe.after = Some(last.tenant.clone());
            probe.limit = 1;
            let more = !pgtenant::admin::list_tenants(client, &probe)
                .await?
                .is_empty();
            more.then(|| last.tenant.clone())
        }
        _ => None,
    };
    if args.output.json {
        return output::json(&output::TenantsPage {
            tenants: records,
            next_after,
        });
    }
    print_tenants(&records)?;
    if let Some(after) = next_after {
        out!("  … more: --after {after}")?;
    }
    Ok(())
}
