//! A tenant's life beyond a lease (DESIGN §5 "Forget (and restore)", "Tenant migrations"):
//! forget, restore, schema_migrated, quarantine, and the tenants a migration walks.
