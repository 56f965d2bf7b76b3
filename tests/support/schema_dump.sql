-- The current text of every object in schema pgtenant, one row per object, ordered by kind,
-- then name, then signature (byte order, whatever the database's collation). tests/schema.rs
-- runs it on a freshly set-up control plane and compares the rows, joined by blank lines, with
-- sql/schema.sql. Also usable on any database, to see whether its control plane is the one
-- this tree builds:
--
--     psql -X -q -At -v ON_ERROR_STOP=1 -d DB -f tests/support/schema_dump.sql
--
-- Only what every database set up by these migrations shares: no OIDs, no database name, no
-- role names. Privileges are written as the difference from PostgreSQL's defaults, with the
-- control plane's owner as CURRENT_USER (the role that ran setup), PUBLIC as PUBLIC, predefined
-- roles (pg_*) by name and any other role as "<another role>". Rows of the tables (config's
-- singleton, refinery's history) are data, not schema: not dumped.
SET search_path = pg_catalog;

WITH
-- Kind order: 1 schema, 2 types, 3 sequences, 4 tables, 5 views, 6 functions.
rels AS (
    SELECT c.oid, c.relname, c.relkind, c.relpersistence, c.relowner, c.relacl, c.reloptions,
           c.relrowsecurity, c.relforcerowsecurity,
           'pgtenant.' || quote_ident(c.relname) AS qname
      FROM pg_class c
     WHERE c.relnamespace = 'pgtenant'::regnamespace
),
procs AS (
    SELECT p.oid, p.proname, p.prokind, p.proowner, p.proacl,
           oidvectortypes(p.proargtypes) AS args,
           'pgtenant.' || quote_ident(p.proname) || '(' || oidvectortypes(p.proargtypes) || ')' AS qname
      FROM pg_proc p
     WHERE p.pronamespace = 'pgtenant'::regnamespace
),
types AS (
    SELECT t.oid, t.typname, t.typtype, t.typowner, t.typacl, t.typbasetype, t.typtypmod,
           t.typnotnull, t.typdefault, t.typrelid,
           'pgtenant.' || quote_ident(t.typname) AS qname
      FROM pg_type t
     WHERE t.typnamespace = 'pgtenant'::regnamespace
       AND t.typcategory <> 'A' -- array types come with their element types
       AND (t.typtype IN ('d', 'e', 'r', 'b', 'p') -- a multirange comes with its range
            OR (t.typtype = 'c' AND (SELECT relkind FROM pg_class WHERE oid = t.typrelid) = 'c'))
),
-- Every object with privileges: what to call it in GRANT, its owner, its ACL and the default.
acl_objects AS (
    SELECT 1 AS ord, 'pgtenant' AS name, '' AS sig, 'SCHEMA pgtenant' AS target, n.nspowner AS owner,
           n.nspacl AS acl, acldefault('n', n.nspowner) AS def
      FROM pg_namespace n WHERE n.nspname = 'pgtenant'
    UNION ALL
    SELECT 2, t.typname, '', 'TYPE ' || t.qname, t.typowner, t.typacl, acldefault('T', t.typowner)
      FROM types t
    UNION ALL
    SELECT CASE r.relkind WHEN 'S' THEN 3 WHEN 'v' THEN 5 WHEN 'm' THEN 5 ELSE 4 END, r.relname, '',
           CASE r.relkind WHEN 'S' THEN 'SEQUENCE ' ELSE 'TABLE ' END || r.qname, r.relowner, r.relacl,
           acldefault(CASE r.relkind WHEN 'S' THEN 's' ELSE 'r' END::"char", r.relowner)
      FROM rels r WHERE r.relkind IN ('r', 'p', 'u', 'v', 'm', 'f', 'S')
    UNION ALL
    SELECT CASE r.relkind WHEN 'v' THEN 5 ELSE 4 END, r.relname, '',
           'TABLE ' || r.qname || ' (' || quote_ident(a.attname) || ')', r.relowner, a.attacl,
           NULL::aclitem[]
      FROM rels r JOIN pg_attribute a ON a.attrelid = r.oid
     WHERE a.attacl IS NOT NULL AND a.attnum > 0 AND NOT a.attisdropped
    UNION ALL
    SELECT 6, p.proname, p.args,
           CASE p.prokind WHEN 'p' THEN 'PROCEDURE ' ELSE 'FUNCTION ' END || p.qname, p.proowner, p.proacl,
           acldefault('f', p.proowner)
      FROM procs p
),
acl_entries AS (
    SELECT o.ord, o.name, o.sig, o.target, o.owner, e.grantee, e.privilege_type, e.is_grantable,
           'grant' AS change
      FROM acl_objects o,
           LATERAL (SELECT (aclexplode(coalesce(o.acl, o.def))).*
                    EXCEPT SELECT (aclexplode(o.def)).*) e
    UNION ALL
    SELECT o.ord, o.name, o.sig, o.target, o.owner, e.grantee, e.privilege_type, e.is_grantable,
           'revoke'
      FROM acl_objects o,
           LATERAL (SELECT (aclexplode(o.def)).*
                    EXCEPT SELECT (aclexplode(coalesce(o.acl, o.def))).*) e
),
acl_lines AS (
    SELECT ord, name, sig,
           string_agg(line, E'\n' ORDER BY line COLLATE "C") AS lines
      FROM (
        SELECT e.ord, e.name, e.sig,
               CASE e.change
                   WHEN 'grant' THEN 'GRANT ' || string_agg(DISTINCT e.privilege_type, ', ')
                                     || ' ON ' || e.target || ' TO ' || g.role
                                     || CASE WHEN e.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END
                   ELSE 'REVOKE ' || CASE WHEN e.is_grantable THEN 'GRANT OPTION FOR ' ELSE '' END
                        || string_agg(DISTINCT e.privilege_type, ', ')
                        || ' ON ' || e.target || ' FROM ' || g.role
               END || ';' AS line
          FROM acl_entries e,
               LATERAL (SELECT CASE
                   WHEN e.grantee = 0 THEN 'PUBLIC'
                   WHEN e.grantee = e.owner THEN 'CURRENT_USER'
                   WHEN e.grantee < 16384 THEN quote_ident((SELECT rolname FROM pg_roles WHERE oid = e.grantee))
                   ELSE '"<another role>"' END AS role) g
         GROUP BY e.ord, e.name, e.sig, e.target, e.change, e.is_grantable, g.role
      ) l
     GROUP BY ord, name, sig
),
-- One row per object: its definition, comments and triggers.
defs AS (
    SELECT 1 AS ord, 'pgtenant' AS name, '' AS sig,
           'CREATE SCHEMA pgtenant;'
           || coalesce(E'\nCOMMENT ON SCHEMA pgtenant IS ' || quote_literal(obj_description(n.oid, 'pg_namespace')) || ';', '')
           AS body
      FROM pg_namespace n WHERE n.nspname = 'pgtenant'
    UNION ALL
    SELECT 2, t.typname, '',
           CASE t.typtype
               WHEN 'd' THEN 'CREATE DOMAIN ' || t.qname || ' AS ' || format_type(t.typbasetype, t.typtypmod)
                   || coalesce(' DEFAULT ' || t.typdefault, '')
                   || CASE WHEN t.typnotnull THEN ' NOT NULL' ELSE '' END
                   || coalesce((SELECT string_agg(E'\n    CONSTRAINT ' || quote_ident(k.conname) || ' ' || pg_get_constraintdef(k.oid),
                                                  '' ORDER BY k.conname COLLATE "C")
                                  FROM pg_constraint k WHERE k.contypid = t.oid), '')
               WHEN 'e' THEN 'CREATE TYPE ' || t.qname || ' AS ENUM ('
                   || (SELECT string_agg(quote_literal(e.enumlabel), ', ' ORDER BY e.enumsortorder)
                         FROM pg_enum e WHERE e.enumtypid = t.oid) || ')'
               WHEN 'c' THEN 'CREATE TYPE ' || t.qname || ' AS ('
                   || (SELECT string_agg(E'\n    ' || quote_ident(a.attname) || ' ' || format_type(a.atttypid, a.atttypmod),
                                         ',' ORDER BY a.attnum)
                         FROM pg_attribute a WHERE a.attrelid = t.typrelid AND a.attnum > 0 AND NOT a.attisdropped)
                   || E'\n)'
               ELSE '-- type ' || t.qname || ' of kind ' || t.typtype::text || ': not described by this dump'
           END || ';'
           || coalesce(E'\nCOMMENT ON TYPE ' || t.qname || ' IS ' || quote_literal(obj_description(t.oid, 'pg_type')) || ';', '')
      FROM types t
    UNION ALL
    SELECT 3, r.relname, '',
           'CREATE SEQUENCE ' || r.qname || ' AS ' || format_type(s.seqtypid, NULL)
           || ' START WITH ' || s.seqstart || ' INCREMENT BY ' || s.seqincrement
           || ' MINVALUE ' || s.seqmin || ' MAXVALUE ' || s.seqmax || ' CACHE ' || s.seqcache
           || CASE WHEN s.seqcycle THEN ' CYCLE' ELSE ' NO CYCLE' END
           || coalesce((SELECT ' OWNED BY pgtenant.' || quote_ident(tc.relname) || '.' || quote_ident(a.attname)
                          FROM pg_depend d
                          JOIN pg_class tc ON tc.oid = d.refobjid
                          JOIN pg_attribute a ON a.attrelid = d.refobjid AND a.attnum = d.refobjsubid
                         WHERE d.classid = 'pg_class'::regclass AND d.objid = r.oid
                           AND d.refclassid = 'pg_class'::regclass AND d.deptype IN ('a', 'i')), '')
           || ';'
           || coalesce(E'\nCOMMENT ON SEQUENCE ' || r.qname || ' IS ' || quote_literal(obj_description(r.oid, 'pg_class')) || ';', '')
      FROM rels r JOIN pg_sequence s ON s.seqrelid = r.oid
    UNION ALL
    SELECT 4, r.relname, '',
           'CREATE ' || CASE WHEN r.relpersistence = 'u' THEN 'UNLOGGED ' ELSE '' END
           || CASE r.relkind WHEN 'f' THEN 'FOREIGN ' ELSE '' END || 'TABLE ' || r.qname || ' ('
           || coalesce((SELECT string_agg(E'\n    ' || col, ',' ORDER BY at) FROM (
                  SELECT a.attnum AS at,
                         quote_ident(a.attname) || ' ' || format_type(a.atttypid, a.atttypmod)
                         || CASE WHEN a.attcollation <> 0 AND a.attcollation <> (SELECT typcollation FROM pg_type WHERE oid = a.atttypid)
                                 THEN ' COLLATE ' || (SELECT quote_ident(collname) FROM pg_collation WHERE oid = a.attcollation) ELSE '' END
                         || CASE a.attidentity WHEN 'a' THEN ' GENERATED ALWAYS AS IDENTITY'
                                               WHEN 'd' THEN ' GENERATED BY DEFAULT AS IDENTITY' ELSE '' END
                         || CASE WHEN a.attgenerated = 's' THEN ' GENERATED ALWAYS AS (' || pg_get_expr(ad.adbin, ad.adrelid) || ') STORED'
                                 WHEN ad.adbin IS NOT NULL THEN ' DEFAULT ' || pg_get_expr(ad.adbin, ad.adrelid) ELSE '' END
                         || CASE WHEN a.attnotnull THEN ' NOT NULL' ELSE '' END AS col
                    FROM pg_attribute a
                    LEFT JOIN pg_attrdef ad ON ad.adrelid = a.attrelid AND ad.adnum = a.attnum
                   WHERE a.attrelid = r.oid AND a.attnum > 0 AND NOT a.attisdropped
                  UNION ALL
                  -- Constraints after the columns, by name (NOT NULL is on the column).
                  SELECT 100000 + row_number() OVER (ORDER BY k.conname COLLATE "C"),
                         'CONSTRAINT ' || quote_ident(k.conname) || ' ' || pg_get_constraintdef(k.oid)
                    FROM pg_constraint k WHERE k.conrelid = r.oid AND k.contype <> 'n'
              ) cols), '')
           || E'\n)'
           || CASE WHEN r.reloptions IS NOT NULL THEN ' WITH (' || array_to_string(r.reloptions, ', ') || ')' ELSE '' END
           || ';'
           || CASE WHEN r.relrowsecurity THEN E'\nALTER TABLE ' || r.qname || ' ENABLE ROW LEVEL SECURITY;' ELSE '' END
           || CASE WHEN r.relforcerowsecurity THEN E'\nALTER TABLE ' || r.qname || ' FORCE ROW LEVEL SECURITY;' ELSE '' END
           -- Indexes that no constraint made.
           || coalesce((SELECT string_agg(E'\n' || pg_get_indexdef(i.indexrelid) || ';', '' ORDER BY ic.relname COLLATE "C")
                          FROM pg_index i JOIN pg_class ic ON ic.oid = i.indexrelid
                         WHERE i.indrelid = r.oid
                           AND NOT EXISTS (SELECT 1 FROM pg_constraint k WHERE k.conindid = i.indexrelid AND k.conrelid = r.oid)), '')
           || coalesce((SELECT string_agg(E'\n' || pg_get_triggerdef(tg.oid) || ';', '' ORDER BY tg.tgname COLLATE "C")
                          FROM pg_trigger tg WHERE tg.tgrelid = r.oid AND NOT tg.tgisinternal), '')
           || coalesce((SELECT string_agg(E'\nCREATE POLICY ' || quote_ident(pol.polname) || ' ON ' || r.qname
                                          || CASE WHEN pol.polpermissive THEN '' ELSE ' AS RESTRICTIVE' END
                                          || ' FOR ' || CASE pol.polcmd WHEN 'r' THEN 'SELECT' WHEN 'a' THEN 'INSERT'
                                                  WHEN 'w' THEN 'UPDATE' WHEN 'd' THEN 'DELETE' ELSE 'ALL' END
                                          || coalesce(' USING (' || pg_get_expr(pol.polqual, pol.polrelid) || ')', '')
                                          || coalesce(' WITH CHECK (' || pg_get_expr(pol.polwithcheck, pol.polrelid) || ')', '')
                                          || ';', '' ORDER BY pol.polname COLLATE "C")
                          FROM pg_policy pol WHERE pol.polrelid = r.oid), '')
           || coalesce(E'\nCOMMENT ON TABLE ' || r.qname || ' IS ' || quote_literal(obj_description(r.oid, 'pg_class')) || ';', '')
           || coalesce((SELECT string_agg(E'\nCOMMENT ON COLUMN ' || r.qname || '.' || quote_ident(a.attname) || ' IS '
                                          || quote_literal(col_description(r.oid, a.attnum)) || ';', '' ORDER BY a.attnum)
                          FROM pg_attribute a
                         WHERE a.attrelid = r.oid AND a.attnum > 0 AND NOT a.attisdropped
                           AND col_description(r.oid, a.attnum) IS NOT NULL), '')
           || coalesce((SELECT string_agg(E'\nCOMMENT ON CONSTRAINT ' || quote_ident(k.conname) || ' ON ' || r.qname || ' IS '
                                          || quote_literal(obj_description(k.oid, 'pg_constraint')) || ';', '' ORDER BY k.conname COLLATE "C")
                          FROM pg_constraint k
                         WHERE k.conrelid = r.oid AND obj_description(k.oid, 'pg_constraint') IS NOT NULL), '')
      FROM rels r WHERE r.relkind IN ('r', 'p', 'f')
    UNION ALL
    SELECT 5, r.relname, '',
           'CREATE ' || CASE r.relkind WHEN 'm' THEN 'MATERIALIZED ' ELSE '' END || 'VIEW ' || r.qname
           || CASE WHEN r.reloptions IS NOT NULL THEN ' WITH (' || array_to_string(r.reloptions, ', ') || ')' ELSE '' END
           || E' AS\n' || rtrim(pg_get_viewdef(r.oid, true), E'; \n') || ';'
           || coalesce((SELECT string_agg(E'\n' || pg_get_triggerdef(tg.oid) || ';', '' ORDER BY tg.tgname COLLATE "C")
                          FROM pg_trigger tg WHERE tg.tgrelid = r.oid AND NOT tg.tgisinternal), '')
           || coalesce(E'\nCOMMENT ON ' || CASE r.relkind WHEN 'm' THEN 'MATERIALIZED ' ELSE '' END || 'VIEW ' || r.qname
                       || ' IS ' || quote_literal(obj_description(r.oid, 'pg_class')) || ';', '')
           || coalesce((SELECT string_agg(E'\nCOMMENT ON COLUMN ' || r.qname || '.' || quote_ident(a.attname) || ' IS '
                                          || quote_literal(col_description(r.oid, a.attnum)) || ';', '' ORDER BY a.attnum)
                          FROM pg_attribute a
                         WHERE a.attrelid = r.oid AND a.attnum > 0 AND NOT a.attisdropped
                           AND col_description(r.oid, a.attnum) IS NOT NULL), '')
      FROM rels r WHERE r.relkind IN ('v', 'm')
    UNION ALL
    -- Anything else pg_class holds here, except what the tables above describe (their indexes,
    -- sequences and TOAST tables are elsewhere): named, so the diff shows it.
    SELECT 4, r.relname, '', '-- relation ' || r.qname || ' of kind ' || r.relkind::text || ': not described by this dump'
      FROM rels r WHERE r.relkind NOT IN ('r', 'p', 'f', 'v', 'm', 'S', 'i', 'I', 't')
    UNION ALL
    SELECT 6, p.proname, p.args,
           CASE WHEN p.prokind = 'a' THEN '-- aggregate ' || p.qname || ': not described by this dump'
                ELSE rtrim(pg_get_functiondef(p.oid), E'\n') || ';' END
           || coalesce(E'\nCOMMENT ON ' || CASE p.prokind WHEN 'p' THEN 'PROCEDURE ' ELSE 'FUNCTION ' END || p.qname
                       || ' IS ' || quote_literal(obj_description(p.oid, 'pg_proc')) || ';', '')
      FROM procs p
)
SELECT d.body || coalesce(E'\n' || a.lines, '') AS object
  FROM defs d
  LEFT JOIN acl_lines a USING (ord, name, sig)
 ORDER BY d.ord, d.name COLLATE "C", d.sig COLLATE "C";
