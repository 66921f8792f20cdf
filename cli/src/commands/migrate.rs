//! `ringwork migrate`: install or upgrade the schema.

use ringwork::{schema, RingSizes};

use super::{connect, schema_name, Result};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    db: super::Db,
}

pub async fn run(args: Args) -> Result<()> {
    let schema = schema_name(&args.db.schema)?;
    let pool = connect(&args.db.database_url, 2).await?;
    let report = schema::migrate(&pool, &schema, RingSizes::default()).await?;
    if report.applied.is_empty() {
        println!(
            "schema {schema}: tables up to date (version {}, checksums verified)",
            schema::SCHEMA_VERSION
        );
    } else {
        let applied: Vec<String> = report.applied.iter().map(|v| v.to_string()).collect();
        println!("schema {schema}: applied migrations {}", applied.join(", "));
    }
    if report.functions_reloaded {
        println!(
            "schema {schema}: installed functions {}",
            report.functions_checksum
        );
    } else {
        println!(
            "schema {schema}: functions up to date ({})",
            report.functions_checksum
        );
    }
    Ok(())
}
