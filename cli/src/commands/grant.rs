//! `ringwork grant`: what a worker, producer or reader role needs, and nothing more.

use super::{schema_name, Result};

#[derive(clap::Args)]
pub struct Args {
    /// The role to grant to (it must exist).
    role: String,
    /// worker (claims, completes, maintenance), producer (inserts jobs), reader (status, a
    /// read-only dashboard).
    #[arg(long)]
    access: ringwork::roles::Access,
    /// Print the statements instead of running them.
    #[arg(long)]
    print: bool,
    #[command(flatten)]
    db: super::GroupDb,
}

pub async fn run(args: Args) -> Result<()> {
    let name = schema_name(&args.db.schema)?;
    let statements = ringwork::roles::grant_statements(&name, &args.role, args.access)?;
    if args.print {
        for statement in &statements {
            println!("{statement};");
        }
        return Ok(());
    }
    let admin = args.db.open().await?;
    let mut tx = admin.pool().begin().await?;
    for statement in &statements {
        sqlx::query(statement).execute(&mut *tx).await?;
    }
    tx.commit().await?;
    println!(
        "granted {} {} access to schema {name} ({} statements)",
        args.role,
        args.access.as_str(),
        statements.len()
    );
    Ok(())
}
