package cdcplatform.serve;

import java.io.IOException;
import java.lang.reflect.Method;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.security.GeneralSecurityException;
import java.security.MessageDigest;
import java.util.Base64;
import java.util.List;
import javax.crypto.SecretKeyFactory;
import javax.crypto.spec.PBEKeySpec;
import javax.security.sasl.AuthenticationException;

import org.apache.hive.service.auth.AuthenticationProviderFactory;
import org.apache.hive.service.auth.PasswdAuthenticationProvider;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The Thrift JDBC/ODBC server's login check for `cdc serve` (HiveServer2's CUSTOM authentication).
 *
 * Hive makes a new instance for every login and calls {@link #Authenticate}. The check is either the
 * platform's password file (lines `NAME:pbkdf2-sha256:ITERATIONS:SALT:HASH`, base64, written by
 * `cdc serve-user add`; read at every login, so an added user needs no restart) or an LDAP bind through
 * Hive's own LDAP provider, configured by Hive's `hive.server2.authentication.ldap.*` properties.
 * Which one, and the file's path, come from the JVM's system properties `cdc.serve.auth` and
 * `cdc.serve.password_file`, which `cdc serve` sets before it starts the server.
 *
 * Why a class of ours at all: Hive's providers log nothing about a failed login. This one logs each
 * with the user name and the client's address (never the password) on the logger
 * `cdc_platform.serve.auth`. The address is the HTTP connection's: Hive hands a provider only the
 * name and password, and over its HTTP transport the provider runs on the thread of Jetty's
 * connection, which Jetty keeps (`HttpConnection.getCurrentConnection`, read by reflection because
 * Spark shades Jetty and may move it; then the address is logged as unknown, never the login refused).
 */
public final class ServeAuthenticator implements PasswdAuthenticationProvider {

  public static final String MODE_PROPERTY = "cdc.serve.auth";
  public static final String FILE_PROPERTY = "cdc.serve.password_file";
  static final String SCHEME = "pbkdf2-sha256";
  private static final Logger LOG = LoggerFactory.getLogger("cdc_platform.serve.auth");
  private static final String JETTY_CONNECTION = "org.sparkproject.jetty.server.HttpConnection";
  /** Hashed for an unknown user too, so the answer's timing does not say which names exist. */
  private static final byte[] DUMMY_SALT = new byte[16];
  private static final int DUMMY_ITERATIONS = 210_000;  // passwords.ITERATIONS, what `cdc serve-user add` writes

  @Override
  public void Authenticate(String user, String password) throws AuthenticationException {
    String mode = System.getProperty(MODE_PROPERTY, "");
    String failure;
    try {
      if ("ldap".equals(mode)) {
        failure = checkLdap(user, password);
      } else if ("password_file".equals(mode)) {
        failure = checkPasswordFile(user, password);
      } else {
        failure = "the server has no login check configured (" + MODE_PROPERTY + "=" + mode + ")";
      }
    } catch (RuntimeException e) {
      failure = "the login check failed: " + e;
    }
    if (failure != null) {
      LOG.warn("failed login for user '{}' from {}: {}", printable(user), clientAddress(), failure);
      throw new AuthenticationException("login failed for user '" + printable(user) + "'");
    }
  }

  private static String checkLdap(String user, String password) {
    try {
      PasswdAuthenticationProvider ldap =
          AuthenticationProviderFactory.getAuthenticationProvider(AuthenticationProviderFactory.AuthMethods.LDAP);
      ldap.Authenticate(user, password);
      return null;
    } catch (AuthenticationException e) {
      Throwable cause = e.getCause() != null ? e.getCause() : e;
      return "LDAP refused it (" + firstLine(cause.getMessage()) + ")";
    }
  }

  private static String checkPasswordFile(String user, String password) {
    String file = System.getProperty(FILE_PROPERTY, "");
    List<String> lines;
    try {
      lines = Files.readAllLines(Paths.get(file), StandardCharsets.UTF_8);
    } catch (IOException e) {
      return "the password file " + file + " cannot be read (" + e + ")";
    }
    String[] entry = null;
    for (String line : lines) {
      String[] parts = line.trim().split(":");
      if (parts.length == 5 && parts[0].equals(user)) {
        entry = parts;
      }
    }
    char[] given = (password == null ? "" : password).toCharArray();
    if (entry == null) {
      hash(given, DUMMY_SALT, DUMMY_ITERATIONS);
      return "no such user in the password file";
    }
    if (!SCHEME.equals(entry[1])) {
      return "the password file's entry is not " + SCHEME;
    }
    try {
      int iterations = Integer.parseInt(entry[2]);
      byte[] salt = Base64.getDecoder().decode(entry[3]);
      byte[] expected = Base64.getDecoder().decode(entry[4]);
      byte[] actual = hash(given, salt, iterations, expected.length * 8);
      return MessageDigest.isEqual(expected, actual) ? null : "wrong password";
    } catch (IllegalArgumentException e) {
      return "the password file's entry for this user is malformed";
    }
  }

  private static byte[] hash(char[] password, byte[] salt, int iterations) {
    return hash(password, salt, iterations, 256);
  }

  static byte[] hash(char[] password, byte[] salt, int iterations, int bits) {
    try {
      PBEKeySpec spec = new PBEKeySpec(password, salt, iterations, bits);
      return SecretKeyFactory.getInstance("PBKDF2WithHmacSHA256").generateSecret(spec).getEncoded();
    } catch (GeneralSecurityException e) {
      throw new IllegalStateException("PBKDF2WithHmacSHA256 is not available in this JVM", e);
    }
  }

  /** The client's address as `host:port`, or why it is not known. */
  static String clientAddress() {
    try {
      Class<?> connection = Class.forName(JETTY_CONNECTION);
      Object current = connection.getMethod("getCurrentConnection").invoke(null);
      if (current == null) {
        return "an unknown address (not an HTTP connection)";
      }
      Object endPoint = connection.getMethod("getEndPoint").invoke(current);
      Method remote = endPoint.getClass().getMethod("getRemoteSocketAddress");
      Object address = remote.invoke(endPoint);
      return address == null ? "an unknown address" : address.toString().replaceFirst("^/", "");
    } catch (ReflectiveOperationException | LinkageError e) {
      return "an unknown address (" + e.getClass().getSimpleName() + ")";
    }
  }

  /** A user name as it may go into a log line: printable, short (a client chooses it). */
  static String printable(String value) {
    if (value == null) {
      return "";
    }
    StringBuilder out = new StringBuilder();
    for (char c : value.toCharArray()) {
      out.append(c >= 0x20 && c != 0x7f && c != '\'' ? c : '?');
      if (out.length() >= 64) {
        out.append("...");
        break;
      }
    }
    return out.toString();
  }

  private static String firstLine(String text) {
    if (text == null) {
      return "no reason given";
    }
    int end = text.indexOf('\n');
    return end < 0 ? text : text.substring(0, end);
  }
}
